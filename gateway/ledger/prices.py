"""Which price applies to a deployment at a moment: versioned prices with effective dates.

Owns the in-memory price table: price versions from the database (``prices`` rows, appended through
the finance API, each in force from its ``effective_from`` until the next version's), falling back to
the policy's list price, and for self-hosted engines (no list price, a ``gpu_dollars_per_hour``) a
price derived from their GPU cost and their throughput as measured here (``gateway.ledger.throughput``). Does not own cost arithmetic (``gateway.ledger.record``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import select

from gateway.ledger.throughput import Throughput, engine_token_price
from gateway.policy import Price
from gateway.store.models import PriceRow

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime

    from gateway.policy import ProviderConfig, Target
    from gateway.store.db import Database


class Priced(NamedTuple):
    """A price and the version it came from (``None``: the policy's list price or a derived one)."""

    price: Price | None
    price_id: int | None


@dataclass(frozen=True, slots=True)
class PriceVersion:
    """One row of the price history."""

    id: int
    deployment: str
    effective_from: datetime
    price: Price
    author: str


class PriceBook:
    """Price versions per deployment, sorted by ``effective_from``; swapped whole on reload.

    Args:
        engines: The provider configuration of a target (``None`` when unknown): a target without a
            list price whose provider has ``gpu_dollars_per_hour`` is priced from its measured throughput.
        throughput: Where engine throughput is measured (a fresh one by default).
    """

    def __init__(
        self,
        engines: Callable[[Target], ProviderConfig | None] | None = None,
        throughput: Throughput | None = None,
    ) -> None:
        self._engines = engines
        self.throughput = throughput or Throughput()
        self._versions: dict[str, list[PriceVersion]] = {}
        self._starts: dict[str, list[datetime]] = {}

    def replace(self, versions: Iterable[PriceVersion]) -> None:
        """Install a whole new history (what ``load`` read)."""
        by: dict[str, list[PriceVersion]] = {}
        for v in versions:
            by.setdefault(v.deployment, []).append(v)
        for vs in by.values():
            vs.sort(key=lambda v: (v.effective_from, v.id))
        self._versions = by
        self._starts = {d: [v.effective_from for v in vs] for d, vs in by.items()}

    async def load(self, db: Database) -> None:
        """Read every price version from the database."""
        async with db.session() as s:
            rows = (await s.scalars(select(PriceRow))).all()
        self.replace(_version(r) for r in rows)

    def history(self, deployment: str | None = None) -> list[PriceVersion]:
        """Versions, oldest first, of one deployment or of all."""
        if deployment is not None:
            return list(self._versions.get(deployment, ()))
        return [v for vs in self._versions.values() for v in vs]

    def price_for(self, target: Target, at: datetime) -> Priced:
        """The price in force for ``target`` at ``at``: the newest version started by then, else the list price."""
        starts = self._starts.get(target.key)
        if starts:
            i = bisect.bisect_right(starts, at)
            if i:
                version = self._versions[target.key][i - 1]
                return Priced(version.price, version.id)
        if target.price is not None:
            return Priced(target.price, None)
        config = self._engine(target)
        if config is not None and config.gpu_dollars_per_hour is not None:
            tokens_per_s = self.throughput.tokens_per_s(target.key)
            if tokens_per_s is not None:
                return Priced(
                    engine_token_price(config.gpu_dollars_per_hour, tokens_per_s, config.prefill_cost_ratio), None
                )
        return Priced(None, None)

    def observe(self, target: Target, start: float, end: float, output_tokens: int) -> None:
        """Count a request a self-hosted engine served (``perf_counter`` times) into its throughput."""
        config = self._engine(target) if target.price is None else None
        if config is not None and config.gpu_dollars_per_hour is not None:
            self.throughput.observe(target.key, start, end, output_tokens)

    def _engine(self, target: Target) -> ProviderConfig | None:
        return self._engines(target) if self._engines is not None else None


async def add_price(db: Database, deployment: str, effective_from: datetime, price: Price, author: str) -> PriceVersion:
    """Append a price version (prices are never edited in place: history is the audit trail)."""
    row = PriceRow(
        deployment=deployment,
        effective_from=effective_from,
        input=price.input,
        output=price.output,
        cached_input=price.cached_input,
        author=author,
    )
    async with db.session() as s, s.begin():
        s.add(row)
    return _version(row)


def _version(row: PriceRow) -> PriceVersion:
    return PriceVersion(
        row.id, row.deployment, row.effective_from, Price(row.input, row.output, row.cached_input), row.author
    )
