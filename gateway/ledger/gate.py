"""Admission and settlement as single operations over the rate-limit counts and the budget counters.

Owns the one atomic step a request with limits goes through before dispatch (charge every rate rule
and reserve the worst-case cost in every budget scope, or do neither), the step after it (release
the reservation, add the actual cost, correct the token charge), which takes the settlements of many
requests at once, and the choice of gate for a pair of counters (``gate_for``). In process
(``MemoryGate``) both steps run without awaiting I/O and so are atomic on the event loop; with Redis,
``gateway.ledger.lease`` builds the gate, which admits from this replica's slices of the shared
counters. Does not own the counters' layout (``gateway.ledger.ratelimit``, ``gateway.ledger.budget``),
what the limits are (``gateway.ledger.limits``) or turning a refusal into an error
(``gateway.ledger.ledger``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.ledger.budget import MemoryCounters, RedisCounters
from gateway.ledger.ratelimit import MemoryCounts, RedisCounts

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.budget import BudgetCounters, Refused
    from gateway.ledger.ratelimit import Ask, Charged, Counts


@dataclass(frozen=True, slots=True)
class Reservation:
    """A budget reservation asked for: ``amount`` nano-dollars in each scope (with its hard limit) of ``period``."""

    scopes: tuple[tuple[str, int | None], ...]
    period: str
    amount: int


@dataclass(frozen=True, slots=True)
class Settlement:
    """How one admitted request ended: its charge corrected to ``tokens``, its reservation to ``actual``."""

    charged: Charged | None
    tokens: int
    reservation: Reservation | None
    actual: int


@dataclass(slots=True)
class Outcome:
    """What ``Gate.admit`` did. Either everything asked was charged and reserved, or nothing was."""

    rates_ok: bool = True
    """``False``: a rate rule refused (nothing charged or reserved)."""
    before: list[tuple[int, int]] = field(default_factory=list)
    """Each rate rule's ``(this window, previous window)`` counts before charging."""
    refused: Refused | None = None
    """A budget scope that refused (nothing charged or reserved)."""
    states: list[tuple[int, int]] = field(default_factory=list)
    """Each budget scope's ``(spent, reserved)`` after reserving (for the soft limits)."""


class Gate(Protocol):
    """The admission and settlement steps. Each call is atomic over all its counters."""

    settle_delay_s: float
    """How long a settlement may wait to travel with the next admission (0: settle at once)."""

    def admit_now(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> tuple[Outcome | None, Sequence[Settlement]]:
        """``admit`` when it can be decided without I/O (``None`` otherwise), and the settlements left to apply."""
        ...

    async def admit(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> Outcome:
        """Apply ``settlements``, then admit: charge ``ask`` and reserve ``reservation``, or neither.

        The admission happens only if every rule and scope admits it. Rate rules are checked first:
        when both would refuse, the outcome is the rate refusal. Settlements apply either way.
        """
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        """For each: correct the token charge, release the reservation and add the actual cost to spent."""
        ...

    async def aclose(self) -> None:
        """Give back what this process holds and send what waits (graceful shutdown)."""
        ...


class MemoryGate:
    """The steps over in-process counters (the embedded default), one counter after the other.

    Atomic: nothing here awaits I/O, so no other request runs between the checks and the charges.
    """

    settle_delay_s = 0.0

    def __init__(self, counts: MemoryCounts, budgets: MemoryCounters) -> None:
        self._counts = counts
        self._budgets = budgets

    def admit_now(
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> tuple[Outcome | None, Sequence[Settlement]]:
        """Never decided here: ``admit`` does it (the counters' methods are coroutines)."""
        return None, settlements

    async def admit(  # noqa: D102
        self, ask: Ask | None, reservation: Reservation | None, settlements: Sequence[Settlement] = ()
    ) -> Outcome:
        if settlements:
            await self.settle(settlements)
        out = Outcome()
        if ask is not None:
            out.rates_ok, out.before = await self._counts.charge(ask.keys, ask.window, ask.weight, ask.checks())
            if not out.rates_ok:
                return out
        if reservation is not None:
            out.refused = await self._budgets.reserve(reservation.scopes, reservation.period, reservation.amount)
            if out.refused is not None:
                if ask is not None:  # undo the charge: a refused request uses none of its rate limits
                    for key, cost in zip(ask.keys, ask.costs, strict=True):
                        await self._counts.adjust(key, ask.window, -cost)
                return out
            out.states = [await self._budgets.state(s, reservation.period) for s, _ in reservation.scopes]
        return out

    async def settle(self, settlements: Sequence[Settlement]) -> None:  # noqa: D102
        for s in settlements:
            if s.reservation is not None:
                scopes = [scope for scope, _ in s.reservation.scopes]
                await self._budgets.settle(scopes, s.reservation.period, s.reservation.amount, s.actual)
            if s.charged is not None and (delta := s.tokens - s.charged.tokens):
                for key in s.charged.token_keys:
                    await self._counts.adjust(key, s.charged.window, delta)

    async def aclose(self) -> None:
        """Nothing is held here."""


def gate_for(counts: Counts, budgets: BudgetCounters) -> Gate:
    """The gate over these counters: both in process, or both in one Redis (per-replica leases).

    Raises:
        ValueError: one counter is in process and the other in Redis, or they use two Redis clients
            (``gateway.ledger.build_ledger`` never builds either).
    """
    if isinstance(counts, MemoryCounts) and isinstance(budgets, MemoryCounters):
        return MemoryGate(counts, budgets)
    if isinstance(counts, RedisCounts) and isinstance(budgets, RedisCounters) and counts.redis is budgets.redis:
        from gateway.ledger.lease import LeasedGate  # here: lease imports this module

        return LeasedGate(counts, budgets)
    raise ValueError(
        f"Rate-limit counts ({type(counts).__name__}) and budget counters ({type(budgets).__name__}) must both "
        "be in process or both in one Redis client."
    )


__all__ = ["Gate", "MemoryGate", "Outcome", "Reservation", "Settlement", "gate_for"]
