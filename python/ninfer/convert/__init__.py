"""Converters to .ninfer artifacts: Hugging Face folders, GGUF files, random weights."""

from __future__ import annotations

from pathlib import Path

from ninfer.convert.hf import convert_hf_folder


def convert_source(
    source: str | Path,
    output: str | Path,
    *,
    dtype: str = "keep",
    progress: bool = True,
    name: str | None = None,
    generation: dict[str, float | int] | None = None,
) -> Path:
    """Convert a HF safetensors folder or a .gguf file into an artifact at `output`.

    A source that already is a .ninfer artifact is validated and returned as it is (nothing
    is written to `output`). Returns the path of the usable artifact. `generation` (GGUF
    sources only, which carry no generation_config) sets the artifact's sampling defaults.
    """
    source = Path(source)
    if generation is not None and (source.is_dir() or source.suffix != ".gguf"):
        raise ValueError("generation defaults can only be given for a GGUF source")
    if source.is_dir():
        return convert_hf_folder(source, output, dtype=dtype, progress=progress, name=name)
    if not source.exists():
        raise FileNotFoundError(f"no such model source: {source}")
    with open(source, "rb") as f:
        magic = f.read(8)
    if magic[:4] == b"GGUF":
        from ninfer.convert.gguf import convert_gguf

        return convert_gguf(
            source, output, dtype=dtype, progress=progress, name=name, generation=generation
        )
    from ninfer.artifact import MAGIC, read_header

    if magic == MAGIC:
        if dtype != "keep":
            raise ValueError(f"{source} already is an artifact; it cannot be re-encoded as {dtype}")
        read_header(source)
        return source
    raise ValueError(
        f"{source}: not a model folder, a GGUF file or a .ninfer artifact (magic {magic[:8]!r})"
    )


__all__ = ["convert_hf_folder", "convert_source"]
