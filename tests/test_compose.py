"""compose.yaml checked against the official Compose Specification schema (vendored, no network).

The schema is `tests/data/compose-spec.json` (see the README beside it for where it came from). The
validator class follows the schema's own `$schema`, so a refresh to another dialect needs no change here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
SCHEMA = Path(__file__).resolve().parent / "data" / "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"


@cache
def _validator() -> Any:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@cache
def _compose_text() -> str:
    return COMPOSE.read_text(encoding="utf-8")


def _compose() -> dict[str, Any]:
    """A fresh copy each call, so a test may mutate it."""
    return copy.deepcopy(yaml.safe_load(_compose_text()))


def _errors(doc: object) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in _validator().iter_errors(doc)]


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return cmd.split() if isinstance(cmd, str) else list(cmd)


def test_vendored_schema_is_the_recorded_upstream_copy() -> None:
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_schema_knows_what_this_file_relies_on() -> None:
    text = SCHEMA.read_text(encoding="utf-8")
    assert "service_completed_successfully" in text
    assert '"reservations"' in text
    assert '"capabilities"' in text


def test_compose_file_validates() -> None:
    assert _errors(_compose()) == []


def test_no_obsolete_version_key() -> None:
    assert "version" not in _compose()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(lambda d: d.__setitem__("servces", d.pop("services")), "servces", id="typo-top-level-key"),
        pytest.param(lambda d: d["services"]["gateway"].__setitem__("ports", "abc"), "ports", id="ports-not-a-list"),
        pytest.param(lambda d: d["services"]["gateway"].__setitem__("comand", ["x"]), "comand", id="typo-service-key"),
        pytest.param(
            lambda d: d["services"]["gateway"]["depends_on"]["migrate"].__setitem__("condition", "service_done"),
            "depends_on",
            id="unknown-depends-on-condition",
        ),
        pytest.param(
            lambda d: d["services"]["engine"]["deploy"]["resources"]["reservations"]["devices"][0].pop("capabilities"),
            "devices",
            id="gpu-device-without-capabilities",
        ),
    ],
)
def test_validator_rejects_broken_copies(mutate: Any, needle: str) -> None:
    doc = _compose()
    mutate(doc)
    errors = _errors(doc)
    assert errors, "the validator accepted a broken compose file"
    assert any(needle in e for e in errors), errors


def test_referenced_dockerfiles_exist() -> None:
    services = _compose()["services"]
    built = {name: s["build"] for name, s in services.items() if "build" in s}
    assert {"migrate", "gateway", "engine"} <= built.keys()
    for name, build in built.items():
        context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (context / dockerfile).is_file(), f"{name}: {context / dockerfile} is missing"


def test_dockerfile_copy_sources_exist() -> None:
    for dockerfile in sorted((ROOT / "docker").glob("*.Dockerfile")):
        for line in dockerfile.read_text(encoding="utf-8").splitlines():
            if m := re.match(r"COPY\s+(?!--)(.+)\s+\S+$", line.strip()):
                for source in m.group(1).split():
                    assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is missing"


def test_depends_on_names_services_and_health_conditions_have_healthchecks() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"


def test_gateway_runs_the_console_script_after_migrations() -> None:
    services = _compose()["services"]
    assert _command(services["gateway"])[:2] == ["crossway", "serve"]
    assert _command(services["migrate"])[:2] == ["crossway", "migrate"]
    assert services["migrate"]["restart"] == "no"
    depends = services["gateway"]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert depends["redis"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_console_scripts_exist() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^crossway\s*=\s*"gateway\.cli:main"', pyproject, re.MULTILINE)


def test_gateway_environment() -> None:
    env = _compose()["services"]["gateway"]["environment"]
    assert env["DATABASE_URL"].startswith("postgresql://")
    assert env["REDIS_URL"].startswith("redis://redis:")
    assert env["CROSSWAY_ADMIN_KEY"].startswith("${CROSSWAY_ADMIN_KEY:?")
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        assert env[key] == f"${{{key}:-}}"
    assert env["CROSSWAY_ENGINE_URL"] == "http://engine:8000/v1"


def test_engine_reserves_one_nvidia_gpu() -> None:
    engine = _compose()["services"]["engine"]
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d["capabilities"]]
    assert len(gpus) == 1
    assert gpus[0]["count"] == 1
    assert _command(engine)[:2] == ["crossway", "engine"]
    assert "healthcheck" in engine
