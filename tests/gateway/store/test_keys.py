from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select, text, update

from gateway.settings import Settings
from gateway.store.keys import (
    KEY_PREFIX,
    PREFIX_LEN,
    ConflictError,
    KeyStore,
    NotFoundError,
    Principal,
    bootstrap,
    hash_key,
    validate_tenant_name,
)
from gateway.store.models import ApiKey

if TYPE_CHECKING:
    from gateway.store.db import Database


def db_of(store: KeyStore) -> Database:
    return store._db


async def test_create_key_returns_key_that_verifies_to_its_tenant(store: KeyStore) -> None:
    info, raw = await store.create_key("acme", name="ci")
    assert raw.startswith(KEY_PREFIX)
    assert len(raw) == len(KEY_PREFIX) + 43
    assert info.prefix == raw[:PREFIX_LEN]
    assert (info.tenant, info.name, info.active) == ("acme", "ci", True)
    assert info.created_at.tzinfo is UTC
    principal = await store.verify(raw)
    tenants = await store.list_tenants()
    assert principal == Principal(tenant_id=tenants[0].id, tenant="acme", key_id=info.id)


async def test_create_key_gives_different_keys_each_time(store: KeyStore) -> None:
    (a, raw_a), (b, raw_b) = await store.create_key("acme"), await store.create_key("acme")
    assert raw_a != raw_b
    assert a.id != b.id
    assert [t.name for t in await store.list_tenants()] == ["acme"]


async def test_create_key_raises_when_tenant_missing_and_creation_disabled(store: KeyStore) -> None:
    with pytest.raises(NotFoundError, match="tenant 'ghost' does not exist"):
        await store.create_key("ghost", create_tenant=False)
    assert await store.count_tenants() == 0


async def test_keys_stored_only_as_sha256(store: KeyStore) -> None:
    """Neither the key nor its secret part appears in any column; the hash is SHA-256 of the key."""
    _, raw = await store.create_key("acme", name="label")
    async with db_of(store).engine.connect() as conn:
        rows = [*(await conn.execute(text("SELECT * FROM api_keys"))).all()]
        rows += (await conn.execute(text("SELECT * FROM tenants"))).all()
        stored_hash = (await conn.execute(select(ApiKey.key_hash))).scalar_one()
    dump = repr(rows)
    assert raw not in dump
    assert raw[PREFIX_LEN:] not in dump
    assert stored_hash == hashlib.sha256(raw.encode()).hexdigest() == hash_key(raw)


async def test_verify_returns_none_when_key_unknown(store: KeyStore) -> None:
    await store.create_key("acme")
    assert await store.verify("cw-" + "x" * 43) is None
    assert await store.verify("") is None
    assert await store.verify("cw-" + "x" * 1000) is None


async def test_verify_returns_none_when_key_revoked(store: KeyStore) -> None:
    info, raw = await store.create_key("acme")
    revoked = await store.revoke_key(info.id)
    assert revoked.revoked_at is not None
    assert not revoked.active
    assert await store.verify(raw) is None


async def test_verify_records_last_used_at_at_most_once_a_minute(store: KeyStore) -> None:
    info, raw = await store.create_key("acme")
    assert (await store.list_keys())[0].last_used_at is None
    await store.verify(raw)
    first = (await store.list_keys())[0].last_used_at
    assert first is not None
    await store.verify(raw)
    assert (await store.list_keys())[0].last_used_at == first
    async with db_of(store).session() as s, s.begin():
        old = datetime.now(UTC) - timedelta(minutes=5)
        await s.execute(update(ApiKey).where(ApiKey.id == info.id).values(last_used_at=old))
    await store.verify(raw)
    later = (await store.list_keys())[0].last_used_at
    assert later is not None
    assert later > old + timedelta(minutes=4)


async def test_revoke_key_accepts_id_digits_prefix_or_whole_key(store: KeyStore) -> None:
    (a, _), (b, _), (c, raw_c) = [await store.create_key("acme") for _ in range(3)]
    assert (await store.revoke_key(str(a.id))).id == a.id
    assert (await store.revoke_key(b.prefix)).id == b.id
    assert (await store.revoke_key(raw_c)).id == c.id
    assert [k.active for k in await store.list_keys()] == [False, False, False]


async def test_revoke_key_is_idempotent(store: KeyStore) -> None:
    info, _ = await store.create_key("acme")
    first = await store.revoke_key(info.id)
    again = await store.revoke_key(info.id)
    assert again.revoked_at == first.revoked_at


async def test_revoke_key_raises_when_not_found(store: KeyStore) -> None:
    with pytest.raises(NotFoundError, match="no API key matches '42'"):
        await store.revoke_key(42)
    with pytest.raises(NotFoundError, match="no API key matches"):
        await store.revoke_key("cw-nope")
    with pytest.raises(NotFoundError, match="give a key id or a prefix"):
        await store.revoke_key("nonsense")


async def test_revoke_key_raises_when_prefix_ambiguous(store: KeyStore) -> None:
    a, _ = await store.create_key("acme")
    b, _ = await store.create_key("acme")
    async with db_of(store).session() as s, s.begin():  # a prefix collision, made on purpose
        await s.execute(update(ApiKey).where(ApiKey.id == b.id).values(prefix=a.prefix))
    with pytest.raises(ConflictError, match="more than one API key"):
        await store.revoke_key(a.prefix[:6])
    assert all(k.active for k in await store.list_keys())


async def test_revoke_key_prefix_treats_like_wildcards_literally(store: KeyStore) -> None:
    key, _ = await store.create_key("acme")
    # token_urlsafe may itself put a "_" after "cw-", so the probe puts it where the key has none
    at = next(i for i, ch in enumerate(key.prefix) if i >= 3 and ch != "_")
    with pytest.raises(NotFoundError):
        await store.revoke_key("cw-%")
    with pytest.raises(NotFoundError):
        await store.revoke_key(key.prefix[:at] + "_")
    with pytest.raises(NotFoundError):
        await store.revoke_key(key.prefix[:at] + "%")


async def test_list_keys_filters_by_tenant_and_includes_revoked(store: KeyStore) -> None:
    a1, _ = await store.create_key("a")
    b1, _ = await store.create_key("b")
    a2, _ = await store.create_key("a")
    await store.revoke_key(a1.id)
    assert [k.id for k in await store.list_keys()] == [a1.id, b1.id, a2.id]
    listed = await store.list_keys("a")
    assert [(k.id, k.active) for k in listed] == [(a1.id, False), (a2.id, True)]
    assert "key_hash" not in repr(listed[0])


async def test_list_keys_raises_when_tenant_unknown(store: KeyStore) -> None:
    with pytest.raises(NotFoundError):
        await store.list_keys("ghost")


async def test_list_tenants_counts_active_keys(store: KeyStore) -> None:
    await store.create_tenant("empty")
    k, _ = await store.create_key("busy")
    await store.create_key("busy")
    await store.revoke_key(k.id)
    tenants = await store.list_tenants()
    assert [(t.name, t.active_keys) for t in tenants] == [("empty", 0), ("busy", 1)]
    assert await store.count_tenants() == 2


async def test_create_tenant_raises_when_name_taken(store: KeyStore) -> None:
    await store.create_tenant("acme")
    with pytest.raises(ConflictError, match="already exists"):
        await store.create_tenant("acme")


@pytest.mark.parametrize("name", ["a", "acme", "team-1.prod_eu", "0", "a" * 64])
def test_validate_tenant_name_accepts_slugs(name: str) -> None:
    assert validate_tenant_name(name) == name


@pytest.mark.parametrize("name", ["", "Acme", "-acme", ".acme", "a b", "a/b", "a" * 65, "ünï", "acme\n"])
def test_validate_tenant_name_rejects_others(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tenant name"):
        validate_tenant_name(name)


async def test_create_key_rejects_invalid_tenant_name(store: KeyStore) -> None:
    with pytest.raises(ValueError, match="invalid tenant name"):
        await store.create_key("Bad Name")
    assert await store.count_tenants() == 0


async def test_bootstrap_creates_default_tenant_and_key_once(store: KeyStore) -> None:
    raw = await bootstrap(Settings(), store)
    assert raw is not None
    principal = await store.verify(raw)
    assert principal is not None
    assert principal.tenant == "default"
    assert await bootstrap(Settings(), store) is None
    assert len(await store.list_keys()) == 1


async def test_bootstrap_does_nothing_when_disabled_or_tenants_exist(store: KeyStore) -> None:
    assert await bootstrap(replace(Settings(), bootstrap=False), store) is None
    assert await store.count_tenants() == 0
    await store.create_tenant("acme")
    assert await bootstrap(Settings(), store) is None
    assert [t.name for t in await store.list_tenants()] == ["acme"]
