"""The dependency direction of DESIGN.md: api -> pipeline -> stages -> providers -> selfhost -> kernels."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(module_path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(module_path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("gateway/errors.py", ("gateway.",)),
        ("gateway/types.py", ("gateway.",)),
        ("gateway/settings.py", ("gateway.",)),
        ("gateway/wire", ("gateway.api", "gateway.pipeline", "gateway.providers", "gateway.dispatch")),
        ("gateway/providers", ("gateway.api", "gateway.pipeline", "gateway.dispatch", "gateway.wire")),
        ("gateway/store", ("gateway.api", "gateway.pipeline", "gateway.providers", "gateway.wire")),
        ("kernels", ("gateway", "selfhost")),
    ],
)
def test_module_never_imports_upstream_layers(folder, forbidden):
    path = ROOT / folder
    files = [path] if path.is_file() else _files(folder)
    offenders = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in files
        for name in _imports(f)
        if any(name == bad.rstrip(".") or name.startswith(bad if bad.endswith(".") else bad + ".") for bad in forbidden)
    ]
    assert offenders == []


def test_only_api_and_cli_import_the_http_framework():
    offenders = [
        str(f.relative_to(ROOT))
        for f in _files("gateway")
        if "litestar" in {n.split(".")[0] for n in _imports(f)} and "api" not in f.parts
    ]
    assert offenders == []
