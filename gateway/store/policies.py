"""Routing policies as versioned documents in the gateway's database.

Owns: saving a policy as a new version (with author, time, comment and a unified diff against the
previous one), reading versions and history, rolling back (which saves the old text as a new
version, so history only grows), seeding from ``policies/*.yaml`` on first start, and the cheap
"newest version" query every replica polls. Does not own validating a policy (callers compile it
with ``gateway.policy.parse_policy`` before saving) nor putting one in force (``gateway.watcher``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from gateway.store.keys import NotFoundError
from gateway.store.models import PolicyVersion

if TYPE_CHECKING:
    from datetime import datetime

    from gateway.store.db import Database

SAVE_ATTEMPTS = 5
"""Two admins saving the same policy at once race for the next version number; the loser retries."""


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """One version of a policy."""

    name: str
    version: int
    body: str
    author: str
    comment: str | None
    diff: str
    created_at: datetime


def _info(row: PolicyVersion) -> PolicyInfo:
    return PolicyInfo(row.name, row.version, row.body, row.author, row.comment, row.diff, row.created_at)


class PolicyStore:
    """Versioned policies; every method is one short transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def save(self, name: str, body: str, author: str, comment: str | None = None) -> PolicyInfo:
        """Append ``body`` as the next version of ``name`` (version 1 if it is new)."""
        for _ in range(SAVE_ATTEMPTS):
            try:
                async with self._db.session() as s, s.begin():
                    previous = await s.scalar(
                        select(PolicyVersion)
                        .where(PolicyVersion.name == name)
                        .order_by(PolicyVersion.version.desc())
                        .limit(1)
                    )
                    row = PolicyVersion(
                        name=name,
                        version=previous.version + 1 if previous else 1,
                        body=body,
                        author=author,
                        comment=comment,
                        diff=_diff(name, previous, body),
                    )
                    s.add(row)
                return _info(row)
            except IntegrityError:
                continue
        raise RuntimeError(f"could not save policy {name!r}: {SAVE_ATTEMPTS} concurrent saves won the race")

    async def latest(self, name: str) -> PolicyInfo | None:
        """The newest version of ``name``, or ``None`` if it was never saved."""
        async with self._db.session() as s:
            row = await s.scalar(
                select(PolicyVersion).where(PolicyVersion.name == name).order_by(PolicyVersion.version.desc()).limit(1)
            )
        return _info(row) if row else None

    async def get(self, name: str, version: int) -> PolicyInfo:
        """One version.

        Raises:
            NotFoundError: no such policy or version.
        """
        async with self._db.session() as s:
            row = await s.scalar(
                select(PolicyVersion).where(PolicyVersion.name == name, PolicyVersion.version == version)
            )
        if row is None:
            raise NotFoundError(f"policy {name!r} has no version {version}")
        return _info(row)

    async def history(self, name: str) -> list[PolicyInfo]:
        """Every version of ``name``, newest first.

        Raises:
            NotFoundError: no such policy.
        """
        async with self._db.session() as s:
            rows = (
                await s.scalars(
                    select(PolicyVersion).where(PolicyVersion.name == name).order_by(PolicyVersion.version.desc())
                )
            ).all()
        if not rows:
            raise NotFoundError(f"no policy named {name!r}")
        return [_info(r) for r in rows]

    async def names(self) -> list[PolicyInfo]:
        """The newest version of every policy, by name."""
        newest = (
            select(PolicyVersion.name, func.max(PolicyVersion.version).label("version"))
            .group_by(PolicyVersion.name)
            .subquery()
        )
        async with self._db.session() as s:
            rows = (
                await s.scalars(
                    select(PolicyVersion)
                    .join(
                        newest,
                        (PolicyVersion.name == newest.c.name) & (PolicyVersion.version == newest.c.version),
                    )
                    .order_by(PolicyVersion.name)
                )
            ).all()
        return [_info(r) for r in rows]

    async def head(self, name: str) -> int:
        """The newest version number of ``name`` (0 if none): what replicas poll to notice edits."""
        async with self._db.session() as s:
            version = await s.scalar(select(func.max(PolicyVersion.version)).where(PolicyVersion.name == name))
        return int(version or 0)

    async def rollback(self, name: str, version: int, author: str) -> PolicyInfo:
        """Save version ``version``'s text again as the newest version.

        Raises:
            NotFoundError: no such policy or version.
        """
        old = await self.get(name, version)
        return await self.save(name, old.body, author, comment=f"rollback to version {version}")

    async def seed(self, name: str, body: str, source: str) -> bool:
        """Save ``body`` as version 1 of ``name`` unless the policy exists; whether it was saved."""
        if await self.head(name):
            return False
        row = PolicyVersion(
            name=name, version=1, body=body, author=f"seed:{source}", comment="seeded from file on first start", diff=""
        )
        try:
            async with self._db.session() as s, s.begin():
                s.add(row)
        except IntegrityError:
            return False  # another replica seeded it at the same moment
        return True


def _diff(name: str, previous: PolicyVersion | None, body: str) -> str:
    if previous is None:
        return ""
    lines = difflib.unified_diff(
        previous.body.splitlines(keepends=True),
        body.splitlines(keepends=True),
        fromfile=f"{name}@{previous.version}",
        tofile=f"{name}@{previous.version + 1}",
    )
    return "".join(lines)
