"""One async database handle for the gateway: an SQLAlchemy ``AsyncEngine`` and its session factory.

Owns: turning a URL into an engine (``postgresql://`` and ``sqlite://`` get their async drivers),
the SQLite connection pragmas, the readiness probe (``ping``) and disposal. Does not own tables
(``gateway.store.models``), schema changes (``gateway.store.migrate``) or queries (``gateway.store.keys``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import event, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from gateway.settings import async_url

if TYPE_CHECKING:
    from types import TracebackType

    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 5_000
"""How long a SQLite writer waits for another writer's lock before failing with ``database is locked``."""


class Database:
    """An async engine plus a session factory; one per process, shared by every store.

    Sessions from ``session()`` do not expire objects on commit, so rows read inside a transaction stay
    usable after it. The engine's pool is safe to share between tasks of one event loop.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions: async_sessionmaker[AsyncSession] = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def connect(cls, url: str, **engine_options: Any) -> Self:
        """Build a handle for ``url``; no connection is opened until first use.

        Args:
            url: SQLAlchemy URL. Plain ``postgresql://``, ``postgres://`` and ``sqlite://`` are upgraded to
                ``asyncpg`` and ``aiosqlite``. A SQLite file's parent folder is created if missing.
            **engine_options: Passed to ``create_async_engine`` (for example ``connect_args``).

        Returns:
            The handle. Call ``aclose()`` when done.
        """
        parsed = make_url(async_url(url))
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
                Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        elif backend == "postgresql":
            # NOTE: pre-ping drops connections a restarted server or a proxy closed while idle.
            engine_options.setdefault("pool_pre_ping", True)
        engine = create_async_engine(parsed, **engine_options)
        if backend == "sqlite":
            event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return cls(engine)

    @property
    def dialect(self) -> str:
        """The backend's name: ``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    def session(self) -> AsyncSession:
        """A new session; use as ``async with db.session() as s, s.begin(): ...``."""
        return self.sessions()

    async def ping(self) -> None:
        """Run ``SELECT 1``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: The database cannot be reached or answered with an error.
            OSError: The connection was refused (some drivers raise this before SQLAlchemy wraps it).
        """
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def aclose(self) -> None:
        """Close every pooled connection. The handle may be used again afterwards (it reconnects)."""
        await self.engine.dispose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"Database({self.engine.url.render_as_string(hide_password=True)!r})"


def _sqlite_pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    """Set per-connection SQLite pragmas: WAL (readers do not block the writer), foreign keys, busy wait."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")  # ignored (stays "memory") for in-memory databases
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a power cut may lose the last commits
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS:d}")
    finally:
        cursor.close()
