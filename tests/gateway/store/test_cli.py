"""The ``crossway`` command, run through ``main([...])`` against a SQLite file."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from typing import TYPE_CHECKING, Any

import pytest

from gateway.cli import main
from gateway.store.db import Database
from gateway.store.keys import KeyStore, Principal
from gateway.store.migrate import current_revision, head_revision

if TYPE_CHECKING:
    from pathlib import Path

    from gateway.settings import Settings


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def crossway(url: str, *args: str) -> int:
    return main(["--database-url", url, *args])


def verify(url: str, raw: str) -> Principal | None:
    async def go() -> Principal | None:
        async with Database.connect(url) as db:
            return await KeyStore(db).verify(raw)

    return asyncio.run(go())


def test_keys_create_prints_only_the_key_on_stdout(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway(url, "keys", "create", "--tenant", "acme", "--name", "ci") == 0
    out, err = capsys.readouterr()
    raw = out.strip()
    assert out == raw + "\n"
    assert "not shown again" in err
    assert raw not in err
    principal = verify(url, raw)
    assert principal is not None
    assert principal.tenant == "acme"


def test_keys_list_shows_prefix_and_label_never_the_key(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    crossway(url, "keys", "create", "--tenant", "acme", "--name", "ci")
    crossway(url, "keys", "create", "--tenant", "other")
    raw = capsys.readouterr().out.splitlines()[0]
    assert crossway(url, "keys", "list", "--tenant", "acme") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "TENANT", "NAME", "PREFIX", "CREATED", "LAST", "USED", "STATUS"]
    assert len(lines) == 2
    assert raw[:12] in lines[1]
    assert " ci " in lines[1]
    assert lines[1].endswith("active")
    assert raw not in "\n".join(lines)
    assert crossway(url, "keys", "list") == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_keys_revoke_by_id_makes_key_fail_verification(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    crossway(url, "keys", "create", "--tenant", "acme")
    raw = capsys.readouterr().out.strip()
    assert crossway(url, "keys", "revoke", "1") == 0
    assert "Revoked key 1" in capsys.readouterr().err
    assert verify(url, raw) is None
    crossway(url, "keys", "list")
    assert "revoked" in capsys.readouterr().out


def test_keys_revoke_by_prefix(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    crossway(url, "keys", "create", "--tenant", "acme")
    raw = capsys.readouterr().out.strip()
    assert crossway(url, "keys", "revoke", raw[:12]) == 0
    assert verify(url, raw) is None


def test_keys_revoke_exits_nonzero_with_one_line_when_key_unknown(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway(url, "keys", "revoke", "999") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "crossway: error: no API key matches '999'\n"


def test_keys_create_exits_nonzero_when_tenant_name_invalid(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway(url, "keys", "create", "--tenant", "Not Valid") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("crossway: error: invalid tenant name 'Not Valid'")
    assert "Traceback" not in err


def test_tenants_create_and_list(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway(url, "tenants", "create", "acme") == 0
    crossway(url, "keys", "create", "--tenant", "acme")
    capsys.readouterr()
    assert crossway(url, "tenants", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "CREATED", "ACTIVE", "KEYS"]
    assert lines[1].split()[1] == "acme"
    assert lines[1].split()[-1] == "1"


def test_tenants_create_exits_nonzero_when_tenant_exists(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    crossway(url, "tenants", "create", "acme")
    assert crossway(url, "tenants", "create", "acme") == 1
    assert capsys.readouterr().err.endswith("crossway: error: tenant 'acme' already exists\n")


def test_migrate_brings_new_database_to_head(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway(url, "migrate") == 0
    assert crossway(url, "migrate") == 0
    assert "up to date" in capsys.readouterr().err

    async def revision() -> str | None:
        async with Database.connect(url) as db:
            return await current_revision(db)

    assert asyncio.run(revision()) == head_revision()


def test_exits_nonzero_with_one_line_when_database_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert crossway("postgresql://postgres@127.0.0.1:1/test", "tenants", "list") == 1
    err = capsys.readouterr().err
    assert err.startswith("crossway: error: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [[], ["keys"], ["keys", "create"], ["serve", "--workers", "0"], ["bogus"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: crossway" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "keys" in capsys.readouterr().out


def test_serve_migrates_then_calls_server_with_overrides(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DATABASE_URL", "CROSSWAY_HOST", "CROSSWAY_PORT", "CROSSWAY_POLICY"):
        # serve exports its flags into os.environ; set first, so that monkeypatch records the
        # variable's state and undoes the export after the test (delenv of an absent name records
        # nothing: CROSSWAY_HOST=192.0.2.1 leaked into later `crossway serve` processes)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    calls: list[tuple[Settings, dict[str, Any]]] = []
    app = types.ModuleType("gateway.api.app")
    app.serve = lambda settings, **kwargs: calls.append((settings, kwargs))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gateway.api.app", app)
    policy = tmp_path / "policy.yaml"
    argv = ["serve", "--host", "192.0.2.1", "--port", "9999", "--policy", str(policy), "--workers", "3"]
    assert crossway(url, *argv) == 0
    [(settings, kwargs)] = calls
    assert (settings.host, settings.port, settings.policy_path, settings.database_url) == (
        "192.0.2.1",
        9999,
        policy.resolve(),
        url,
    )
    assert kwargs == {"workers": 3}
    assert verify(url, "cw-nothing") is None  # the schema exists: serve migrated it
    assert os.environ["CROSSWAY_PORT"] == "9999"
    assert os.environ["DATABASE_URL"] == url
