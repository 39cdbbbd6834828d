"""`ninfer-convert`: build a .ninfer artifact from a HF folder, a GGUF file or random weights."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ninfer.convert.tensors import TARGET_DTYPES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ninfer-convert",
        description="Convert a Hugging Face safetensors folder or a GGUF file into a .ninfer "
        "artifact, or make a random-weight artifact of a config.",
    )
    parser.add_argument("source", nargs="?", help="model folder (config.json + *.safetensors) "
                        "or .gguf file; omit with --random")
    parser.add_argument("-o", "--output", help="artifact to write (.ninfer)")
    parser.add_argument("--dtype", choices=TARGET_DTYPES, default=None,
                        help="matrix storage: keep the source's (default; GGUF k-quants become "
                        "q8_0), f32, bf16 or q8_0. Norms and biases are always f32.")
    parser.add_argument("--name", help="model name stored in the metadata (the served model id)")
    parser.add_argument("--random", metavar="CONFIG",
                        help="write seeded random weights for this HF config.json, or for a "
                        "named preset (qwen3.6-27b, qwen3.6-35b-a3b), instead")
    parser.add_argument("--header-only", action="store_true",
                        help="with --random: write the header, tokenizer and template only, "
                        "for `ninfer-serve --load-format dummy`")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    parser.add_argument("--tokenizer", metavar="TOKENIZER.json",
                        help="tokenizer for --random, or 'synthetic' for a small generated "
                        "byte-level BPE (default: the real Qwen3.5/3.6 tokenizer for those "
                        "configs, the synthetic one otherwise)")
    parser.add_argument("--dry-run", action="store_true",
                        help="plan only: print the architecture, tensor count, parameters "
                        "and size, and write nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return parser


def _tokenizer_argument(value: str | None) -> str | Path | None:
    from ninfer.convert.random import SYNTHETIC

    if value is None or value == SYNTHETIC:
        return value
    return Path(value)


def _random_config(value: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """--random's config.json dict and, for a preset, the release's generation config."""
    from ninfer.convert.qwen3_5_presets import (
        QWEN3_6_GENERATION_CONFIG,
        preset_names,
        qwen3_5_preset,
    )

    if value.lower() in preset_names() and not Path(value).exists():
        return qwen3_5_preset(value), dict(QWEN3_6_GENERATION_CONFIG)
    return json.loads(Path(value).read_text(encoding="utf-8")), None


def _print_plan(args: argparse.Namespace) -> None:
    """--dry-run: the tensor table's summary, from config/headers only."""
    if args.random is not None:
        from ninfer.convert.random import plan_random_artifact

        config, _ = _random_config(args.random)
        plan = plan_random_artifact(config, dtype=args.dtype or "bf16")
        architecture, tensors = plan.architecture, plan.tensors
        notes: list[str] = []
    else:
        from ninfer.convert.hf import plan_hf_conversion

        if not Path(args.source).is_dir():
            raise ValueError("--dry-run plans Hugging Face folders and --random configs only")
        hf_plan = plan_hf_conversion(args.source, dtype=args.dtype or "keep")
        architecture, notes = hf_plan.architecture, hf_plan.notes
        tensors = {n: (p.dtype, p.shape) for n, p in hf_plan.tensors.items()}
    from ninfer.artifact.layout import tensor_nbytes

    parameters = sum(math.prod(shape) for _, shape in tensors.values())
    size = sum(tensor_nbytes(dtype, shape) for dtype, shape in tensors.values())
    for note in notes:
        print(f"note: {note}")
    print(f"architecture {architecture}: {len(tensors)} tensors, {parameters:,} parameters, "
          f"{size / 1e9:.2f} GB of tensor data")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.random is None and args.source is None:
        parser.error("give a SOURCE to convert, or --random CONFIG.json")
    if args.random is not None and args.source is not None:
        parser.error("SOURCE and --random exclude each other")
    if args.random is None and args.tokenizer is not None:
        parser.error("--tokenizer only applies to --random")
    if args.random is None and args.header_only:
        parser.error("--header-only only applies to --random")
    from ninfer.convert.random import DUMMY_WEIGHT_DTYPES

    if args.header_only and args.dtype not in (None, *DUMMY_WEIGHT_DTYPES):
        parser.error(f"--header-only stores no weights: --dtype {args.dtype} does not apply "
                     f"(the engine's dummy weights are {', '.join(DUMMY_WEIGHT_DTYPES)})")
    if args.output is None and not args.dry_run:
        parser.error("give -o OUT.ninfer (or --dry-run)")
    if not args.quiet:
        logging.basicConfig(level=logging.INFO, format="ninfer-convert: %(message)s")
    try:
        if args.dry_run:
            _print_plan(args)
            return 0
        if args.random is not None:
            from ninfer.convert.random import make_random_artifact

            config, generation = _random_config(args.random)
            out = make_random_artifact(
                config, args.output, seed=args.seed, dtype=args.dtype or "bf16",
                tokenizer=_tokenizer_argument(args.tokenizer), name=args.name,
                generation=generation, header_only=args.header_only, progress=not args.quiet,
            )
        else:
            from ninfer.convert import convert_source

            out = convert_source(args.source, args.output, dtype=args.dtype or "keep",
                                 progress=not args.quiet, name=args.name)
    except (OSError, ValueError, KeyError) as e:
        print(f"ninfer-convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
