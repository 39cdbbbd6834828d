"""Chat templates shipped with NInfer, used when a model artifact carries none."""

from __future__ import annotations

from pathlib import Path

_TEMPLATE_DIR = Path(__file__).with_name("templates")

# Architecture → template file; the Qwen3.5 template also serves Qwen3.6 (same format).
_BY_ARCHITECTURE = {"qwen3_5": "qwen3_5.jinja", "qwen3_5_moe": "qwen3_5.jinja"}


def builtin_template(name: str) -> str:
    """Source of templates/<name>.jinja."""
    path = _TEMPLATE_DIR / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in _TEMPLATE_DIR.glob("*.jinja"))
        raise KeyError(f"no built-in chat template {name!r} (known: {', '.join(known)})")
    return path.read_text(encoding="utf-8")


def template_for_architecture(architecture: str) -> str | None:
    """The built-in template for an artifact architecture, or None when there is none."""
    file = _BY_ARCHITECTURE.get(architecture)
    return (_TEMPLATE_DIR / file).read_text(encoding="utf-8") if file else None
