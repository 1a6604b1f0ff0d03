from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from gateway.store.db import Database
from gateway.store.keys import KeyStore
from gateway.store.migrate import MIGRATIONS_DIR, current_revision, head_revision, migrate, upgrade
from gateway.store.models import Base
from tests.gateway.store.conftest import postgres_database, postgres_schema

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.engine import Connection


async def _tables(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


def test_migrations_folder_sits_beside_gateway_package() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    newest = max(f.name[:4] for f in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert head_revision() == newest


async def test_upgrade_creates_tables_and_records_head(db: Database) -> None:
    assert await current_revision(db) is None
    await upgrade(db)
    assert {"tenants", "api_keys", "alembic_version"} <= await _tables(db)
    assert await current_revision(db) == head_revision()


async def test_upgrade_is_noop_when_already_at_head(db: Database) -> None:
    await upgrade(db)
    _, raw = await KeyStore(db).create_key("acme")
    await upgrade(db)
    assert await current_revision(db) == head_revision()
    assert await KeyStore(db).verify(raw) is not None


async def test_migrations_match_models(db: Database) -> None:
    """Autogenerate finds no difference between the migrated schema and the models."""
    await upgrade(db)

    def diff(conn: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata))

    async with db.engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_migrate_upgrades_database_at_plain_sqlite_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crossway.db'}"
    await migrate(url)
    await migrate(url)
    async with Database.connect(url) as db:
        assert await current_revision(db) == head_revision()


async def test_concurrent_upgrades_on_postgresql_take_turns() -> None:
    """Replicas starting together do not collide: the advisory lock serializes their upgrades."""
    async with postgres_schema() as schema, postgres_database(schema) as a, postgres_database(schema) as b:
        await asyncio.gather(upgrade(a), upgrade(b), upgrade(a))
        assert await current_revision(a) == head_revision()
