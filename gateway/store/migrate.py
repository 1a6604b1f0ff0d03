"""Bring the gateway's database schema up to date with Alembic, from code (no ``alembic.ini`` needed).

Owns: locating ``migrations/`` (it sits beside the ``gateway`` package in a source checkout or an
editable install; it is not packaged), running upgrades through an async engine, and serializing
concurrent upgrades from several replicas on PostgreSQL. Does not own the revisions themselves
(``migrations/versions/``) or the table definitions (``gateway.store.models``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from gateway.store.db import Database

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
"""``<repository>/migrations``, beside the ``gateway`` package (``Path(gateway.__file__).parent.parent``)."""

_PG_LOCK_ID = 0x63726F7373776179  # "crossway": one advisory lock id for every replica's upgrade


class MigrationError(RuntimeError):
    """The migrations cannot be found or loaded."""


def alembic_config(script_location: Path = MIGRATIONS_DIR) -> Config:
    """An Alembic ``Config`` built in code.

    Raises:
        MigrationError: The migrations folder is missing (for example, a non-editable install).
    """
    if not (script_location / "env.py").is_file():
        raise MigrationError(
            f"Alembic migrations not found at {script_location}: run Crossway from a source checkout "
            "or an editable install (pip install -e .)"
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    return cfg


def head_revision() -> str:
    """The newest revision in ``migrations/versions``."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the repository always ships at least one revision
        raise MigrationError(f"no Alembic revisions under {MIGRATIONS_DIR / 'versions'}")
    return head


async def migrate(url: str) -> None:
    """Upgrade the database at ``url`` to the newest revision; a no-op when it is already there.

    Args:
        url: SQLAlchemy URL; plain ``postgresql://`` and ``sqlite://`` are accepted.
    """
    async with Database.connect(url) as db:
        await upgrade(db)


async def upgrade(db: Database, revision: str = "head") -> None:
    """Upgrade the database behind ``db`` to ``revision`` in one transaction.

    On PostgreSQL a transaction-scoped advisory lock makes replicas that start together take turns;
    DDL is transactional there, so a failed upgrade leaves nothing behind.
    """
    cfg = alembic_config()
    async with db.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        await conn.run_sync(_upgrade, cfg, revision)


async def current_revision(db: Database) -> str | None:
    """The revision the database is at, or ``None`` before the first migration."""
    async with db.engine.connect() as conn:
        return await conn.run_sync(_current_revision)


def _upgrade(connection: Connection, cfg: Config, revision: str) -> None:
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
