"""Authentication of API callers and of the admin API.

Owns: reading the key from ``Authorization: Bearer ...`` or ``x-api-key`` (the Anthropic SDK's
header), turning a key into a ``Principal`` with an in-process cache of verified keys (by hash, for
``ttl_s``; unknown keys for a shorter time), and the admin checks (the admin key, and the read-only
finance key). Does not own key storage or the key format (``gateway.store.keys``) or how errors are
rendered (``gateway.wire``).

The raw key is never logged, stored or kept: the cache is keyed by its SHA-256.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Literal

from gateway.errors import AuthenticationError, PermissionDenied
from gateway.store.keys import hash_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.store.keys import KeyStore, Principal

MISSING_KEY = (
    "Missing API key. Provide it in an Authorization header using Bearer auth "
    "(Authorization: Bearer YOUR_KEY) or in an x-api-key header."
)
INCORRECT_KEY = "Incorrect API key provided."
ADMIN_DISABLED = "The admin API is disabled: set CROSSWAY_ADMIN_KEY to enable it."
READ_ONLY_KEY = "The finance key is read-only: this request changes something and needs the admin key."

AdminRole = Literal["admin", "finance"]
"""``admin`` may do everything under ``/admin``; ``finance`` may only read reports, budgets and policies."""


class Authenticator:
    """Turns a presented API key into a ``Principal``, asking the key store at most once per ``ttl_s``.

    The cache is a bounded LRU keyed by the key's hash. A revoke on another replica is seen once the
    entry expires; a local revoke should call ``forget`` so it takes effect at once. Concurrent
    lookups of the same uncached key share one database query. Use from one event loop.

    Args:
        keys: Where keys are verified.
        ttl_s: How long a verified key is trusted without asking the store again.
        clock: Monotonic seconds; injectable for tests.
        negative_ttl_s: How long an unknown or revoked key is remembered as such (at most ``ttl_s``).
        max_entries: Cache bound; the least recently used entries are dropped first.
    """

    def __init__(
        self,
        keys: KeyStore,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        negative_ttl_s: float = 2.0,
        max_entries: int = 10_000,
    ) -> None:
        if ttl_s < 0 or negative_ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s and negative_ttl_s must be >= 0 and max_entries >= 1")
        self._keys = keys
        self._ttl_s = ttl_s
        self._negative_ttl_s = min(negative_ttl_s, ttl_s)
        self._clock = clock
        self._max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[Principal | None]] = {}

    async def authenticate(self, raw_key: str | None) -> Principal:
        """The principal of ``raw_key``.

        Raises:
            AuthenticationError: The key is missing, unknown or revoked.
        """
        if not raw_key:
            raise AuthenticationError(MISSING_KEY, code="missing_api_key")
        key_hash = hash_key(raw_key)
        now = self._clock()
        entry = self._cache.get(key_hash)
        if entry is not None and entry[0] > now:
            self._cache.move_to_end(key_hash)
            principal = entry[1]
        else:
            principal = await self._lookup(raw_key, key_hash)
        if principal is None:
            raise AuthenticationError(INCORRECT_KEY, code="invalid_api_key")
        return principal

    def forget(self, key_hash: str) -> None:
        """Drop a key from the cache, so that its next use asks the store (call after a revoke).

        A lookup of this key already under way still answers its callers but is not cached.
        """
        self._cache.pop(key_hash, None)
        self._inflight.pop(key_hash, None)

    def clear(self) -> None:
        """Drop every cached key."""
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)

    async def _lookup(self, raw_key: str, key_hash: str) -> Principal | None:
        task = self._inflight.get(key_hash)
        if task is None:
            task = asyncio.create_task(self._verify(raw_key, key_hash))
            self._inflight[key_hash] = task
            task.add_done_callback(lambda t: self._done(key_hash, t))
        # NOTE: shield, so a caller that gives up does not cancel the query other callers wait on.
        return await asyncio.shield(task)

    async def _verify(self, raw_key: str, key_hash: str) -> Principal | None:
        principal = await self._keys.verify(raw_key)
        if self._inflight.get(key_hash) is asyncio.current_task():  # not forgotten while the query ran
            ttl = self._ttl_s if principal is not None else self._negative_ttl_s
            self._cache[key_hash] = (self._clock() + ttl, principal)
            self._cache.move_to_end(key_hash)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return principal

    def _done(self, key_hash: str, task: asyncio.Task[Principal | None]) -> None:
        if self._inflight.get(key_hash) is task:
            del self._inflight[key_hash]
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure no caller awaited is not reported as lost


def bearer_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The API key a request presents: ``Authorization: Bearer <key>`` first, then ``x-api-key``.

    Returns:
        The key, or ``None`` when neither header carries one (a non-Bearer Authorization is ignored).
    """
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
    if x_api_key and x_api_key.strip():
        return x_api_key.strip()
    return None


def admin_role(presented: str | None, admin_key: str | None, finance_key: str | None = None) -> AdminRole:
    """Which admin role a presented key carries: the admin key, or the read-only finance key.

    Both configured keys are compared (in constant time) whatever the first comparison gave.

    Raises:
        PermissionDenied: Neither key is configured, so the admin API is off.
        AuthenticationError: The presented key is missing or is neither key.
    """
    if not admin_key and not finance_key:
        raise PermissionDenied(ADMIN_DISABLED)
    if not presented:
        raise AuthenticationError("Missing admin key. Provide it in an Authorization header using Bearer auth.")
    is_admin = _same(presented, admin_key)
    is_finance = _same(presented, finance_key)
    if is_admin:
        return "admin"
    if is_finance:
        return "finance"
    raise AuthenticationError("Incorrect admin key provided.", code="invalid_api_key")


def check_admin(presented: str | None, admin_key: str | None, finance_key: str | None = None) -> None:
    """Allow an admin request only with the configured admin key (compared in constant time).

    Raises:
        PermissionDenied: No admin key is configured, so the admin API is off; or the presented key is
            the read-only finance key.
        AuthenticationError: The presented key is missing or wrong.
    """
    if not admin_key:
        raise PermissionDenied(ADMIN_DISABLED)
    if admin_role(presented, admin_key, finance_key) != "admin":
        raise PermissionDenied(READ_ONLY_KEY, code="read_only_key")


def _same(presented: str, configured: str | None) -> bool:
    return bool(configured) and hmac.compare_digest(presented.encode(), (configured or "").encode())
