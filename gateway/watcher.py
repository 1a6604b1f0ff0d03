"""Keeps this replica on the newest stored version of its policy.

Owns: at startup, seeding the store from ``policies/*.yaml`` (only names it has never seen) and
putting the stored newest version in force; afterwards, checking the store's newest version number
every ``interval_s`` and, when it moved, compiling that version and swapping it in
(``Runtime.swap``). When Redis is configured, a save publishes on ``CHANNEL`` so that every replica
checks at once instead of at its next poll. A stored version that does not compile on this replica
is logged and skipped: the running policy stays in force. Does not own storage
(``gateway.store.policies``) or validation (``gateway.policy``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from gateway.policy import PolicyError, parse_policy

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from redis.asyncio import Redis

    from gateway.runtime import Runtime
    from gateway.store.policies import PolicyStore

log = structlog.get_logger(__name__)

CHANNEL = "crossway:policy"


class PolicyWatcher:
    """Seeds, loads and follows one named policy for one runtime."""

    def __init__(
        self,
        store: PolicyStore,
        runtime: Runtime,
        name: str,
        env: Mapping[str, str],
        *,
        interval_s: float = 1.0,
        redis: Redis | None = None,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.name = name
        self.env = env
        self.interval_s = interval_s
        self.redis = redis
        self.version = 0
        """The stored version in force (0: the file's policy, before the store had one)."""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, policy_dir: Path) -> None:
        """Seed the store from ``policy_dir/*.yaml``, put the newest stored version in force, start following."""
        for path, text in await asyncio.to_thread(_read_all, policy_dir):
            try:
                parse_policy(text, self.env, source=str(path))
            except PolicyError as exc:
                log.warning("policy_seed_skipped", file=str(path), error=str(exc))
                continue
            if await self.store.seed(path.stem, text, path.name):
                log.info("policy_seeded", name=path.stem, file=str(path))
        await self.check()
        self._tasks.append(asyncio.create_task(self._poll(), name="policy-poll"))
        if self.redis is not None:
            self._tasks.append(asyncio.create_task(self._listen(), name="policy-listen"))

    async def check(self) -> bool:
        """Put the newest stored version in force if it is newer than the running one; whether it changed."""
        head = await self.store.head(self.name)
        if head <= self.version:
            return False
        stored = await self.store.get(self.name, head)
        try:
            policy = parse_policy(stored.body, self.env, source=f"{self.name}@{head}")
        except PolicyError as exc:
            log.error("policy_version_rejected", name=self.name, version=head, error=str(exc))
            self.version = head  # do not retry the same broken text every second
            return False
        self.runtime.swap(policy, head)
        self.version = head
        return True

    async def announce(self) -> None:
        """Tell every replica that a policy changed (a no-op without Redis: they poll)."""
        self._wake.set()
        if self.redis is not None:
            try:
                await self.redis.publish(CHANNEL, self.name)
            except Exception as exc:  # noqa: BLE001 - Redis down: replicas still see the edit at their next poll
                log.warning("policy_announce_failed", error=str(exc))

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not stop following edits
                log.warning("policy_check_failed", error=str(exc))

    async def _listen(self) -> None:
        assert self.redis is not None  # noqa: S101 - only started with Redis
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: polling still works; try again later
                log.warning("policy_listen_failed", error=str(exc))
                await asyncio.sleep(self.interval_s * 5)

    async def aclose(self) -> None:
        """Stop following."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _read_all(policy_dir: Path) -> list[tuple[Path, str]]:
    return [(path, path.read_text(encoding="utf-8")) for path in sorted(policy_dir.glob("*.yaml"))]
