"""The gateway's tables as SQLAlchemy 2 typed declarative models.

Owns: table and column definitions and the constraint naming convention, so that constraint and index
names are the same on SQLite and PostgreSQL and migrations can refer to them. Does not own schema
changes: every change here needs a migration in ``migrations/versions/`` (a test compares the two).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Alembic's recommended convention; migrations spell out the same names."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on both back-ends.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as naive UTC and
    read back as aware UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; naive on SQLite.

        Raises:
            ValueError: ``value`` is naive (its time zone would be a guess).
        """
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware value")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """Read back as timezone-aware UTC."""
        if value is None:
            return None
        if not isinstance(value, datetime):  # pragma: no cover - both drivers return datetime
            raise TypeError(f"expected a datetime from the database, got {type(value).__name__}")
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base; its ``metadata`` carries the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    """A team or application that owns API keys; usage, limits and budgets are accounted per tenant."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    """Lower-case slug, validated by ``gateway.store.keys.validate_tenant_name``."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, server_default=func.now())

    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", passive_deletes=True)


class ApiKey(Base):
    """One API key of a tenant. Only the SHA-256 of the key is stored; the key itself is shown once."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(128))
    """Free-form label chosen at creation (``--name``)."""
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    """The key's first characters, shown in listings and accepted by ``revoke``."""
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    """Lower-case hex SHA-256 of the whole key."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """Refreshed at most once a minute per replica, when the key is verified against the database."""

    tenant: Mapped[Tenant] = relationship(back_populates="keys")


class PolicyVersion(Base):
    """One saved version of a named routing policy.

    Versions are never edited or deleted: an update or a rollback appends a new version, so the history
    is the audit trail.
    """

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[int] = mapped_column(Integer)
    """1, 2, 3... per name."""
    body: Mapped[str] = mapped_column(Text)
    """The policy YAML exactly as submitted."""
    author: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str | None] = mapped_column(Text)
    diff: Mapped[str] = mapped_column(Text, default="")
    """Unified diff against the previous version (empty for the first)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, server_default=func.now())


class UsageRow(Base):
    """One request's usage, cost and latency (``gateway.ledger.record.UsageRecord``); append-only.

    ``tenant`` is a name, not a foreign key: spend history outlives a deleted tenant.
    """

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_tenant_ts", "tenant", "ts"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    """The record's own id; a retried batch skips ids already written."""
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    request_id: Mapped[str] = mapped_column(String(128), index=True)
    tenant: Mapped[str | None] = mapped_column(String(64))
    tenant_id: Mapped[int | None] = mapped_column(Integer)
    key_id: Mapped[int | None] = mapped_column(Integer)
    endpoint: Mapped[str] = mapped_column(String(32))
    alias: Mapped[str] = mapped_column(String(256))
    provider: Mapped[str | None] = mapped_column(String(64))
    deployment: Mapped[str | None] = mapped_column(String(256))
    slo_class: Mapped[str] = mapped_column(String(64))
    streamed: Mapped[bool] = mapped_column(Boolean)
    input_tokens: Mapped[int] = mapped_column(Integer)
    cached_input_tokens: Mapped[int] = mapped_column(Integer)
    cache_write_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    usage_source: Mapped[str] = mapped_column(String(16))
    price_id: Mapped[int | None] = mapped_column(Integer)
    cost_nanos: Mapped[int] = mapped_column(BigInteger)
    """US dollars times 10^9."""
    saved_nanos: Mapped[int] = mapped_column(BigInteger)
    queue_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float] = mapped_column(Float)
    slo_met: Mapped[bool | None] = mapped_column(Boolean)
    status: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(64))


class PriceRow(Base):
    """One price version of a deployment, in force from ``effective_from``; never edited, only appended."""

    __tablename__ = "prices"
    __table_args__ = (Index("ix_prices_deployment_effective_from", "deployment", "effective_from"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(256))
    """``provider/model`` as in the policy."""
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    input: Mapped[float] = mapped_column(Float)
    """US dollars per million tokens."""
    output: Mapped[float] = mapped_column(Float)
    cached_input: Mapped[float | None] = mapped_column(Float)
    author: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, server_default=func.now())


class LimitRow(Base):
    """Rate limits and monthly budget of a tenant (``key_id`` 0) or of one of its keys."""

    __tablename__ = "tenant_limits"
    __table_args__ = (UniqueConstraint("tenant", "key_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[int] = mapped_column(Integer, default=0)
    """0 for the tenant as a whole (not NULL, so the unique constraint holds on PostgreSQL too)."""
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    budget_soft_usd: Mapped[float | None] = mapped_column(Float)
    """Monthly spend past which requests still pass but are flagged and logged."""
    budget_hard_usd: Mapped[float | None] = mapped_column(Float)
    """Monthly spend no request may take the tenant (or key) past; reservations count."""
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, server_default=func.now())
