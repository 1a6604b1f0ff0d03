"""Database fixtures: the same contract runs on SQLite (a file in tmp_path) and on the real PostgreSQL.

Each PostgreSQL test gets its own schema (``search_path`` set on every connection), dropped afterwards,
so tests are isolated from each other, from other test modules and from a ``public`` schema in use.
A missing PostgreSQL server fails the test; it is never skipped.
"""

from __future__ import annotations

import os
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gateway.store.db import Database
from gateway.store.keys import KeyStore
from gateway.store.migrate import upgrade

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

POSTGRES_URL = os.environ.get("CROSSWAY_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


@asynccontextmanager
async def postgres_schema() -> AsyncIterator[str]:
    """Create a uniquely named schema and drop it (with everything in it) afterwards."""
    schema = f"crossway_test_{uuid.uuid4().hex[:12]}"
    admin = Database.connect(POSTGRES_URL)
    try:
        try:
            async with admin.engine.begin() as conn:
                await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        except (OSError, SQLAlchemyError) as exc:
            pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required for these tests and is not usable: {exc!r}")
        try:
            yield schema
        finally:
            async with admin.engine.begin() as conn:
                await conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        await admin.aclose()


def postgres_database(schema: str) -> Database:
    """A handle whose connections see only ``schema``."""
    return Database.connect(POSTGRES_URL, connect_args={"server_settings": {"search_path": schema}})


@asynccontextmanager
async def open_database(backend: str, tmp_path: Path) -> AsyncIterator[Database]:
    """An empty database of ``backend``, disposed afterwards."""
    if backend == "sqlite":
        async with Database.connect(f"sqlite:///{tmp_path / 'crossway.db'}") as db:
            yield db
    else:
        async with postgres_schema() as schema, postgres_database(schema) as db:
            yield db


@pytest.fixture(params=BACKENDS)
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """An empty database, once per back-end."""
    async with open_database(request.param, tmp_path) as database:
        yield database


@pytest.fixture
async def store(db: Database) -> KeyStore:
    """A key store over a migrated database, once per back-end."""
    await upgrade(db)
    return KeyStore(db)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[KeyStore]:
    """A key store over a migrated SQLite file, for tests of logic above the database."""
    async with open_database("sqlite", tmp_path) as database:
        await upgrade(database)
        yield KeyStore(database)
