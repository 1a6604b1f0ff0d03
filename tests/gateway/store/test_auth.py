from __future__ import annotations

import asyncio

import pytest

from gateway.auth import Authenticator, admin_role, bearer_key, check_admin
from gateway.errors import AuthenticationError, PermissionDenied
from gateway.settings import Settings
from gateway.store.keys import KeyStore, Principal, hash_key


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(KeyStore):
    """The real store, counting how often keys are verified against the database."""

    def __init__(self, store: KeyStore) -> None:
        super().__init__(store._db)
        self.verify_calls = 0

    async def verify(self, raw_key: str) -> Principal | None:
        self.verify_calls += 1
        return await super().verify(raw_key)


@pytest.fixture
def keys(sqlite_store: KeyStore) -> CountingStore:
    return CountingStore(sqlite_store)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_authenticate_returns_principal_and_caches_it(keys: CountingStore, clock: FakeClock) -> None:
    info, raw = await keys.create_key("acme")
    auth = Authenticator(keys, ttl_s=10, clock=clock)
    first = await auth.authenticate(raw)
    assert first.tenant == "acme"
    assert first.key_id == info.id
    assert await auth.authenticate(raw) == first
    assert keys.verify_calls == 1


async def test_authenticate_raises_when_key_missing(keys: CountingStore) -> None:
    auth = Authenticator(keys, ttl_s=10)
    for missing in (None, ""):
        with pytest.raises(AuthenticationError, match="Missing API key") as exc:
            await auth.authenticate(missing)
        assert exc.value.status_code == 401
    assert keys.verify_calls == 0


async def test_authenticate_raises_when_key_unknown(keys: CountingStore) -> None:
    auth = Authenticator(keys, ttl_s=10)
    with pytest.raises(AuthenticationError, match=r"^Incorrect API key provided\.$") as exc:
        await auth.authenticate("cw-unknown")
    assert exc.value.code == "invalid_api_key"
    assert "cw-unknown" not in str(exc.value)


async def test_authenticate_rejects_at_once_after_revoke_and_forget(keys: CountingStore, clock: FakeClock) -> None:
    info, raw = await keys.create_key("acme")
    auth = Authenticator(keys, ttl_s=3600, clock=clock)
    await auth.authenticate(raw)
    revoked = await keys.revoke_key(info.id)
    auth.forget(revoked.key_hash)
    with pytest.raises(AuthenticationError):
        await auth.authenticate(raw)


async def test_authenticate_trusts_cache_until_ttl_then_rechecks_database(
    keys: CountingStore, clock: FakeClock
) -> None:
    """A revoke elsewhere (no forget here) is seen once the cached entry expires."""
    info, raw = await keys.create_key("acme")
    auth = Authenticator(keys, ttl_s=10, clock=clock)
    await auth.authenticate(raw)
    await keys.revoke_key(info.id)
    clock.now += 9.9
    assert (await auth.authenticate(raw)).key_id == info.id
    clock.now += 0.2
    with pytest.raises(AuthenticationError):
        await auth.authenticate(raw)
    assert keys.verify_calls == 2


async def test_authenticate_caches_unknown_keys_briefly(keys: CountingStore, clock: FakeClock) -> None:
    auth = Authenticator(keys, ttl_s=10, clock=clock, negative_ttl_s=1)
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            await auth.authenticate("cw-unknown")
    assert keys.verify_calls == 1
    clock.now += 1.5
    with pytest.raises(AuthenticationError):
        await auth.authenticate("cw-unknown")
    assert keys.verify_calls == 2


async def test_authenticate_propagates_store_failure_without_caching_it(keys: CountingStore) -> None:
    _, raw = await keys.create_key("acme")

    class FlakyStore(CountingStore):
        async def verify(self, raw_key: str) -> Principal | None:
            self.verify_calls += 1
            if self.verify_calls == 1:
                raise ConnectionError("database went away")
            return await KeyStore.verify(self, raw_key)

    flaky = FlakyStore(keys)
    auth = Authenticator(flaky, ttl_s=10)
    with pytest.raises(ConnectionError):
        await auth.authenticate(raw)
    assert (await auth.authenticate(raw)).tenant == "acme"
    assert flaky.verify_calls == 2


async def test_authenticate_cache_is_bounded_lru(keys: CountingStore, clock: FakeClock) -> None:
    raws = [(await keys.create_key("acme"))[1] for _ in range(3)]
    auth = Authenticator(keys, ttl_s=10, clock=clock, max_entries=2)
    await auth.authenticate(raws[0])
    await auth.authenticate(raws[1])
    await auth.authenticate(raws[0])  # raws[1] is now least recently used
    await auth.authenticate(raws[2])
    assert len(auth) == 2
    assert keys.verify_calls == 3
    await auth.authenticate(raws[0])
    assert keys.verify_calls == 3
    await auth.authenticate(raws[1])
    assert keys.verify_calls == 4


async def test_authenticate_shares_one_lookup_between_concurrent_callers(keys: CountingStore) -> None:
    _, raw = await keys.create_key("acme")
    auth = Authenticator(keys, ttl_s=10)
    results = await asyncio.gather(*(auth.authenticate(raw) for _ in range(20)))
    assert len(set(results)) == 1
    assert keys.verify_calls == 1


async def test_authenticator_cache_holds_hashes_not_keys(keys: CountingStore) -> None:
    _, raw = await keys.create_key("acme")
    auth = Authenticator(keys, ttl_s=10)
    await auth.authenticate(raw)
    assert list(auth._cache) == [hash_key(raw)]


def test_authenticator_rejects_negative_ttl(keys: CountingStore) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        Authenticator(keys, ttl_s=-1)


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "expected"),
    [
        ("Bearer cw-abc", None, "cw-abc"),
        ("bearer   cw-abc  ", None, "cw-abc"),
        (None, "cw-xyz", "cw-xyz"),
        ("Bearer cw-abc", "cw-xyz", "cw-abc"),
        ("Basic dXNlcjpwYXNz", "cw-xyz", "cw-xyz"),
        ("Basic dXNlcjpwYXNz", None, None),
        ("Bearer ", None, None),
        ("Bearer", "  ", None),
        (None, None, None),
    ],
)
def test_bearer_key_reads_authorization_then_x_api_key(
    authorization: str | None, x_api_key: str | None, expected: str | None
) -> None:
    assert bearer_key(authorization, x_api_key) == expected


def test_check_admin_passes_with_right_key() -> None:
    check_admin("s3cret", "s3cret")


def test_check_admin_denies_when_no_admin_key_configured() -> None:
    with pytest.raises(PermissionDenied, match="CROSSWAY_ADMIN_KEY") as exc:
        check_admin("anything", None)
    assert exc.value.status_code == 403


@pytest.mark.parametrize("presented", [None, "", "wrong", "s3cre", "s3cret-", "ünïcode"])
def test_check_admin_raises_authentication_error_when_key_missing_or_wrong(presented: str | None) -> None:
    with pytest.raises(AuthenticationError) as exc:
        check_admin(presented, "s3cret")
    assert exc.value.status_code == 401


def test_admin_role_tells_the_admin_key_from_the_finance_key() -> None:
    assert admin_role("s3cret", "s3cret", "f1nance") == "admin"
    assert admin_role("f1nance", "s3cret", "f1nance") == "finance"
    assert admin_role("f1nance", None, "f1nance") == "finance"  # a finance key alone still reads


@pytest.mark.parametrize("presented", [None, "", "wrong", "f1nanc", "s3cret"])
def test_admin_role_rejects_any_other_key_with_401(presented: str | None) -> None:
    with pytest.raises(AuthenticationError) as exc:
        admin_role(presented, None, "f1nance")
    assert exc.value.status_code == 401


def test_admin_role_denies_when_no_key_is_configured() -> None:
    with pytest.raises(PermissionDenied, match="CROSSWAY_ADMIN_KEY"):
        admin_role("anything", None, None)


def test_check_admin_refuses_the_finance_key_with_403() -> None:
    with pytest.raises(PermissionDenied, match="read-only") as exc:
        check_admin("f1nance", "s3cret", "f1nance")
    assert (exc.value.status_code, exc.value.code) == (403, "read_only_key")
    check_admin("s3cret", "s3cret", "f1nance")


def test_settings_read_the_finance_key_from_the_environment() -> None:
    settings = Settings.from_env({"CROSSWAY_ADMIN_KEY": "adm1n-secret", "CROSSWAY_FINANCE_KEY": "f1n-secret"})
    assert (settings.admin_key, settings.finance_key) == ("adm1n-secret", "f1n-secret")
    assert Settings.from_env({"CROSSWAY_FINANCE_KEY": ""}).finance_key is None
    assert "f1n-secret" not in repr(settings)
