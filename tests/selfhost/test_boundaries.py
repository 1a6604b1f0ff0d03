"""``selfhost`` never imports ``gateway`` (the dependency runs the other way)."""

from __future__ import annotations

import ast
from pathlib import Path

import selfhost


def test_selfhost_never_imports_gateway() -> None:
    root = Path(selfhost.__file__).parent
    offenders = []
    for file in root.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{file.name}: {n}" for n in names if n == "gateway" or n.startswith("gateway.")]
    assert offenders == []
