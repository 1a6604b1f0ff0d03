"""Process settings, read once from the environment into a frozen object and passed down.

Owns: which database, Redis, policy file, admin key and limits the process uses, plus a snapshot of
the environment variables that provider credentials may name. Does not own routing, limits or
prices: those are policies (``policies/``), validated by ``gateway.policy``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway process reads from its environment."""

    database_url: str = "sqlite+aiosqlite:///crossway.db"
    """SQLAlchemy async URL. ``postgresql://`` and ``sqlite://`` are upgraded to their async drivers."""
    redis_url: str | None = None
    """Shared cache, limits and queues; ``None`` means in-process implementations."""
    policy_path: Path = DEFAULT_POLICY
    """The routing policy file (YAML)."""
    admin_key: str | None = field(default=None, repr=False)
    """Bearer key for ``/admin`` routes; admin routes answer 403 while it is unset."""
    finance_key: str | None = field(default=None, repr=False)
    """Read-only bearer key: the dashboard and the ``GET`` routes of ``/admin/finance`` and ``/admin/policies``;
    every write answers 403 with it."""
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 8 * 1024 * 1024
    """Larger request bodies get 413."""
    log_level: str = "info"
    log_json: bool = True
    log_content: bool = False
    """Log prompt and completion text (debug only; off by default)."""
    key_cache_ttl_s: float = 10.0
    """How long a verified API key is trusted without asking the database again; bounds how late a
    revocation reaches other replicas (a replica that revokes forgets the key at once)."""
    policy_poll_s: float = 1.0
    """How often this replica checks the database for a newer version of its policy (Redis, when
    configured, announces edits at once)."""
    cache_memory_bytes: int = 64 * 1024 * 1024
    """Byte cap of the in-process response cache (used when ``redis_url`` is unset)."""
    ledger: bool = True
    """Usage records, budgets and rate limits (``CROSSWAY_LEDGER=off`` turns all three off, for benchmarks)."""
    bootstrap: bool = True
    """On first start with no tenants, create tenant ``default`` and print one key."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """Snapshot of the environment variables that policies may name for provider keys and URLs."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read settings from ``environ`` (default ``os.environ``); keyword overrides win."""
        e = dict(os.environ if environ is None else environ)
        d = cls()  # the defaults (class attributes of a slots dataclass are descriptors, not values)
        values: dict[str, object] = {
            "database_url": e.get("DATABASE_URL", d.database_url),
            "redis_url": e.get("REDIS_URL") or None,
            "policy_path": Path(e["CROSSWAY_POLICY"]) if e.get("CROSSWAY_POLICY") else DEFAULT_POLICY,
            "admin_key": e.get("CROSSWAY_ADMIN_KEY") or None,
            "finance_key": e.get("CROSSWAY_FINANCE_KEY") or None,
            "host": e.get("CROSSWAY_HOST", d.host),
            "port": int(e.get("CROSSWAY_PORT", d.port)),
            "max_body_bytes": int(e.get("CROSSWAY_MAX_BODY_BYTES", d.max_body_bytes)),
            "log_level": e.get("CROSSWAY_LOG_LEVEL", d.log_level).lower(),
            "log_json": e.get("CROSSWAY_LOG_FORMAT", "json") == "json",
            "log_content": e.get("CROSSWAY_LOG_CONTENT", "") in {"1", "true", "yes"},
            "cache_memory_bytes": int(e.get("CROSSWAY_CACHE_MEMORY_BYTES", d.cache_memory_bytes)),
            "policy_poll_s": float(e.get("CROSSWAY_POLICY_POLL_S", d.policy_poll_s)),
            "ledger": e.get("CROSSWAY_LEDGER", "on").lower() not in {"0", "off", "false", "no"},
            "env": MappingProxyType(e),
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def async_database_url(self) -> str:
        """The database URL with its async driver named."""
        return async_url(self.database_url)


def async_url(url: str) -> str:
    """Name the async driver in a SQLAlchemy URL: ``postgresql://`` -> ``postgresql+asyncpg://``."""
    for plain, driver in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(plain):
            return driver + url[len(plain) :]
    return url
