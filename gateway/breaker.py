"""Circuit breakers, one per deployment: stop sending to a deployment that keeps failing, then probe it.

    closed --(``failures`` consecutive failures)--> open --(``cooldown_s`` later)--> half-open
    half-open --(the one probe succeeds)--> closed;  half-open --(the probe fails)--> open again

Owns the state machine and its clock. Does not own what counts as a failure (``gateway.dispatch``
reports upstream errors and timeouts, never the caller's own mistakes).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable

State = Literal["closed", "open", "half_open"]


class Breaker:
    """The breaker of one deployment."""

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    def state(self, now: float) -> State:
        """The state at ``now``, without changing anything (the router and ``explain`` peek with this)."""
        if self.opened_at is None:
            return "closed"
        if self.probing or now - self.opened_at < self.cooldown_s:
            return "open"
        return "half_open"

    def acquire(self, now: float) -> bool:
        """Whether an attempt may go now; in half-open, the first caller takes the one probe."""
        state = self.state(now)
        if state == "half_open":
            self.probing = True
            return True
        return state == "closed"

    def success(self) -> bool:
        """An attempt succeeded: close. True when that ended an outage (the breaker was open or probing)."""
        recovered = self.opened_at is not None
        self.failures = 0
        self.opened_at = None
        self.probing = False
        return recovered

    def failure(self, now: float) -> None:
        """An attempt failed: count it; open at the threshold, or at once after a failed probe."""
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = now
        self.probing = False

    def release(self) -> None:
        """An attempt ended without a verdict (the caller's error, a cancelled request): free the probe."""
        self.probing = False


class Breakers:
    """Every deployment's breaker, created closed on first mention."""

    def __init__(
        self, failures: int = 5, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._by_key: dict[str, Breaker] = {}

    def __getitem__(self, key: str) -> Breaker:
        breaker = self._by_key.get(key)
        if breaker is None:
            breaker = self._by_key[key] = Breaker(self.failures, self.cooldown_s)
        return breaker

    def state(self, key: str) -> State:
        """The state of ``key``'s breaker now."""
        breaker = self._by_key.get(key)
        return "closed" if breaker is None else breaker.state(self.clock())

    def configure(self, failures: int, cooldown_s: float) -> None:
        """Apply new thresholds from an edited policy; breakers keep their state."""
        self.failures, self.cooldown_s = failures, cooldown_s
        for breaker in self._by_key.values():
            breaker.threshold, breaker.cooldown_s = failures, cooldown_s
