"""The policy store on SQLite and PostgreSQL: versions, diffs, rollback, seeding, concurrent saves."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from gateway.store.keys import NotFoundError
from gateway.store.migrate import upgrade
from gateway.store.policies import PolicyStore

if TYPE_CHECKING:
    from gateway.store.db import Database


@pytest.fixture
async def policies(db: Database) -> PolicyStore:
    await upgrade(db)
    return PolicyStore(db)


async def test_each_save_appends_a_version_with_author_comment_and_diff(policies: PolicyStore):
    first = await policies.save("main", "a: 1\nb: 2\n", "alice", "start")
    second = await policies.save("main", "a: 1\nb: 3\n", "bob")
    assert (first.version, first.diff) == (1, "")
    assert second.version == 2 and second.author == "bob" and second.comment is None
    assert "-b: 2\n+b: 3\n" in second.diff and "main@1" in second.diff and "main@2" in second.diff
    assert [p.version for p in await policies.history("main")] == [2, 1]
    assert (await policies.latest("main")).body == "a: 1\nb: 3\n"  # type: ignore[union-attr]
    assert await policies.head("main") == 2 and await policies.head("other") == 0


async def test_rollback_saves_the_old_text_as_the_newest_version(policies: PolicyStore):
    await policies.save("main", "v: 1\n", "alice")
    await policies.save("main", "v: 2\n", "alice")
    back = await policies.rollback("main", 1, "carol")
    assert (back.version, back.body, back.author) == (3, "v: 1\n", "carol")
    assert back.comment == "rollback to version 1"
    with pytest.raises(NotFoundError):
        await policies.rollback("main", 9, "carol")


async def test_seed_writes_only_a_policy_never_saved_before(policies: PolicyStore):
    assert await policies.seed("default", "x: 1\n", "default.yaml") is True
    assert await policies.seed("default", "x: 2\n", "default.yaml") is False
    only = await policies.history("default")
    assert [(p.version, p.body, p.author) for p in only] == [(1, "x: 1\n", "seed:default.yaml")]


async def test_concurrent_saves_get_distinct_consecutive_versions(policies: PolicyStore):
    saved = await asyncio.gather(*(policies.save("main", f"n: {i}\n", "bot") for i in range(5)))
    assert sorted(p.version for p in saved) == [1, 2, 3, 4, 5]
    names = await policies.names()
    assert [(p.name, p.version) for p in names] == [("main", 5)]
