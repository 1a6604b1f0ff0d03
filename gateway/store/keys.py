"""Tenants and their API keys, stored in the gateway's database.

Owns: tenant names and their validation, the key format (``cw-`` + 43 URL-safe characters), key
hashing (only a key's SHA-256 is stored; the key is returned once, at creation), creation,
revocation, listings, verification of a presented key, and the first-start bootstrap. Does not own
HTTP authentication, caching of verified keys or error rendering (``gateway.auth``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import and_, func, select, update
from sqlalchemy.exc import IntegrityError

from gateway.store.models import ApiKey, Tenant, utcnow

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncSession

    from gateway.settings import Settings
    from gateway.store.db import Database

KEY_PREFIX = "cw-"
"""Every key starts with this, so leaked keys are easy to recognize (and to scan for)."""
PREFIX_LEN = 12
"""How many leading characters of a key are stored in clear and shown in listings."""
MAX_KEY_LEN = 256
"""Longer presented keys are rejected without a database lookup."""
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""``last_used_at`` is written only when it is older than this, to keep verification mostly read-only."""
BOOTSTRAP_TENANT = "default"

_TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class NotFoundError(LookupError):
    """The tenant or key named does not exist."""


class ConflictError(ValueError):
    """The tenant exists already, or a key prefix matches more than one key."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a verified key belongs to; attached to every authenticated request."""

    tenant_id: int
    tenant: str
    key_id: int


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """A tenant as shown in listings."""

    id: int
    name: str
    created_at: datetime
    active_keys: int
    """Keys not revoked."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """An API key as shown in listings: never the key itself."""

    id: int
    tenant: str
    name: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    key_hash: str = field(repr=False)
    """For ``Authenticator.forget`` after a revoke; not a secret, but not worth printing either."""

    @property
    def active(self) -> bool:
        """Whether the key still authenticates."""
        return self.revoked_at is None


def validate_tenant_name(name: str) -> str:
    """Return ``name`` if it is a valid tenant name.

    Raises:
        ValueError: It is not 1-64 characters of ``a-z 0-9 . _ -`` starting with a letter or digit.
    """
    if not _TENANT_NAME.fullmatch(name):
        raise ValueError(
            f"invalid tenant name {name!r}: use 1-64 characters of lower-case letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return name


def generate_key() -> str:
    """A new random API key: ``cw-`` followed by 256 bits, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(raw_key: str) -> str:
    """The stored form of a key: lower-case hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


class KeyStore:
    """Tenants and API keys over a ``Database``. Every method runs its own short transaction.

    Safe to share between tasks; holds no state besides the database handle.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_tenant(self, name: str) -> TenantInfo:
        """Create a tenant.

        Raises:
            ValueError: The name is invalid.
            ConflictError: A tenant with this name exists.
        """
        validate_tenant_name(name)
        try:
            async with self._db.session() as s, s.begin():
                tenant = Tenant(name=name)
                s.add(tenant)
                await s.flush()
                return TenantInfo(tenant.id, tenant.name, tenant.created_at, 0)
        except IntegrityError as exc:
            raise ConflictError(f"tenant {name!r} already exists") from exc

    async def list_tenants(self) -> list[TenantInfo]:
        """Every tenant with its number of active keys, by id."""
        active = func.count(ApiKey.id)
        stmt = (
            select(Tenant, active)
            .outerjoin(ApiKey, and_(ApiKey.tenant_id == Tenant.id, ApiKey.revoked_at.is_(None)))
            .group_by(Tenant.id)
            .order_by(Tenant.id)
        )
        async with self._db.session() as s:
            rows = (await s.execute(stmt)).all()
        return [TenantInfo(t.id, t.name, t.created_at, n) for t, n in rows]

    async def count_tenants(self) -> int:
        """How many tenants exist."""
        async with self._db.session() as s:
            return (await s.execute(select(func.count(Tenant.id)))).scalar_one()

    async def create_key(
        self, tenant: str, *, name: str | None = None, create_tenant: bool = True
    ) -> tuple[KeyInfo, str]:
        """Create an API key for ``tenant``.

        Args:
            tenant: The tenant's name.
            name: An optional label for listings.
            create_tenant: Create the tenant when it does not exist yet.

        Returns:
            The key's listing entry and the key itself. The key is not stored and cannot be shown again.

        Raises:
            ValueError: The tenant name is invalid.
            NotFoundError: The tenant does not exist and ``create_tenant`` is false.
        """
        validate_tenant_name(tenant)
        if create_tenant:
            with contextlib.suppress(ConflictError):  # it exists, or a concurrent call just created it
                await self.create_tenant(tenant)
        raw = generate_key()
        async with self._db.session() as s, s.begin():
            tenant_row = await self._tenant(s, tenant)
            key = ApiKey(tenant_id=tenant_row.id, name=name, prefix=raw[:PREFIX_LEN], key_hash=hash_key(raw))
            s.add(key)
            await s.flush()
            return _key_info(key, tenant_row.name), raw

    async def revoke_key(self, key: int | str) -> KeyInfo:
        """Revoke a key; revoking a revoked key changes nothing and returns it.

        Args:
            key: The key's id (an int or a string of digits), the start of the key as shown in listings
                (at least ``cw-`` and one more character), or the whole key.

        Returns:
            The revoked key. Pass its ``key_hash`` to ``Authenticator.forget``.

        Raises:
            NotFoundError: No key matches.
            ConflictError: The prefix matches more than one key.
        """
        async with self._db.session() as s, s.begin():
            stmt = select(ApiKey, Tenant.name).join(Tenant)
            if isinstance(key, int) or key.isdecimal():
                stmt = stmt.where(ApiKey.id == int(key))
            elif len(key) > PREFIX_LEN:
                stmt = stmt.where(ApiKey.key_hash == hash_key(key))
            elif key.startswith(KEY_PREFIX) and len(key) > len(KEY_PREFIX):
                stmt = stmt.where(ApiKey.prefix.startswith(key, autoescape=True))
            else:
                raise NotFoundError(f"no API key matches {_shown(key)!r}: give a key id or a prefix such as 'cw-AbC'")
            rows = (await s.execute(stmt.limit(2))).all()
            if not rows:
                raise NotFoundError(f"no API key matches {_shown(str(key))!r}")
            if len(rows) > 1:
                raise ConflictError(f"{key!r} matches more than one API key: give the key id instead")
            row, tenant_name = rows[0]
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            return _key_info(row, tenant_name)

    async def list_keys(self, tenant: str | None = None) -> list[KeyInfo]:
        """Keys, revoked ones included, by id; only ``tenant``'s when given.

        Raises:
            NotFoundError: ``tenant`` does not exist.
        """
        stmt = select(ApiKey, Tenant.name).join(Tenant).order_by(ApiKey.id)
        async with self._db.session() as s:
            if tenant is not None:
                stmt = stmt.where(ApiKey.tenant_id == (await self._tenant(s, tenant)).id)
            rows = (await s.execute(stmt)).all()
        return [_key_info(k, t) for k, t in rows]

    async def verify(self, raw_key: str) -> Principal | None:
        """Look up a presented key by its hash.

        Returns:
            The key's principal, or ``None`` when the key is unknown or revoked.
        """
        if not raw_key or len(raw_key) > MAX_KEY_LEN:
            return None
        stmt = (
            select(ApiKey.id, ApiKey.revoked_at, ApiKey.last_used_at, Tenant.id, Tenant.name)
            .join(Tenant)
            .where(ApiKey.key_hash == hash_key(raw_key))
        )
        async with self._db.session() as s, s.begin():
            row = (await s.execute(stmt)).one_or_none()
            if row is None or row[1] is not None:
                return None
            key_id, _, last_used, tenant_id, tenant = row
            now = utcnow()
            if last_used is None or now - last_used >= LAST_USED_RESOLUTION:
                await s.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=now))
        return Principal(tenant_id=tenant_id, tenant=tenant, key_id=key_id)

    @staticmethod
    async def _tenant(s: AsyncSession, name: str) -> Tenant:
        tenant = (await s.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()
        if tenant is None:
            raise NotFoundError(f"tenant {name!r} does not exist")
        return tenant


async def bootstrap(settings: Settings, keys: KeyStore) -> str | None:
    """On a first start, create tenant ``default`` with one key.

    Does nothing when ``settings.bootstrap`` is off or any tenant exists; when replicas start together,
    only the one that creates the tenant creates a key.

    Returns:
        The new key, for the server to print once, or ``None``.
    """
    if not settings.bootstrap or await keys.count_tenants() > 0:
        return None
    try:
        await keys.create_tenant(BOOTSTRAP_TENANT)
    except ConflictError:
        return None
    _, raw = await keys.create_key(BOOTSTRAP_TENANT, name="bootstrap", create_tenant=False)
    return raw


def _key_info(key: ApiKey, tenant: str) -> KeyInfo:
    return KeyInfo(
        id=key.id,
        tenant=tenant,
        name=key.name,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        last_used_at=key.last_used_at,
        key_hash=key.key_hash,
    )


def _shown(key: str) -> str:
    """What an error message may repeat of a user-given key: never more than the stored prefix."""
    return key if len(key) <= PREFIX_LEN else key[:PREFIX_LEN] + "..."
