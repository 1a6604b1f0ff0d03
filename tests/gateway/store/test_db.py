from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gateway.store.db import Database

if TYPE_CHECKING:
    from pathlib import Path


async def test_ping_succeeds_when_database_reachable(db: Database) -> None:
    await db.ping()


async def test_ping_raises_when_server_unreachable() -> None:
    async with Database.connect("postgresql://postgres@127.0.0.1:1/test") as db:
        with pytest.raises((OSError, SQLAlchemyError)):
            await db.ping()


async def test_connect_accepts_plain_sqlite_url_and_creates_parent_folder(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "crossway.db"
    async with Database.connect(f"sqlite:///{path}") as db:
        assert db.engine.url.drivername == "sqlite+aiosqlite"
        assert db.dialect == "sqlite"
        await db.ping()
    assert path.exists()


async def test_connect_accepts_plain_postgresql_url() -> None:
    async with Database.connect("postgresql://postgres@127.0.0.1:5432/test") as db:
        assert db.engine.url.drivername == "postgresql+asyncpg"
        await db.ping()


async def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    async with Database.connect(f"sqlite:///{tmp_path / 'x.db'}") as db, db.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
        assert (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one() == 1
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar_one() == 5000


async def test_sqlite_in_memory_database_works() -> None:
    async with Database.connect("sqlite+aiosqlite:///:memory:") as db:
        await db.ping()


def test_repr_hides_password() -> None:
    db = Database.connect("postgresql://user:hunter2@db.example/crossway")
    assert "hunter2" not in repr(db)
