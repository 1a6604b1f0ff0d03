"""Alembic environment for the gateway's database (SQLite and PostgreSQL, async drivers).

Two ways in:
- ``gateway.store.migrate`` (``crossway migrate``, ``crossway serve``) passes an open sync-facing
  connection in ``config.attributes["connection"]`` (the ``run_sync`` pattern); no ini file is read.
- The plain ``alembic`` command (``alembic.ini`` at the repository root, for writing new revisions)
  builds an async engine from ``-x url=...``, ``sqlalchemy.url`` or ``DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import logging.config
from typing import TYPE_CHECKING

from alembic import context

from gateway.settings import Settings, async_url
from gateway.store.db import Database
from gateway.store.models import Base

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return async_url(url or Settings.from_env().database_url)


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER goes through table copies
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Print SQL instead of running it (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    """Run pending migrations on ``connection``."""
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    """Open an async engine from the configured URL and run migrations through ``run_sync``."""
    async with Database.connect(_url()) as db, db.engine.begin() as conn:
        await conn.run_sync(do_run_migrations)


def run_migrations_online() -> None:
    """Use the caller's connection when given one, else connect from the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
    else:
        asyncio.run(run_async_migrations())


if config.config_file_name is not None and config.attributes.get("connection") is None:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
