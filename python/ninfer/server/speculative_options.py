"""The speculative-decoding flags of ninfer-serve: --spec, --draft-tokens and n-gram drafting.

The MTP head (`--spec mtp`), its reduced-vocabulary proposal head (`--lm-head-draft`) and
n-gram copy drafting are served; DFlash/DFlash2 drafters, tree verification and the
cross-request n-gram archive are not in this build and are refused by name
(options.UNAVAILABLE_OPTIONS, and --spec dflash|dflash2 here).
"""

from __future__ import annotations

import argparse

SPEC_BACKENDS = ("off", "mtp", "dflash", "dflash2")
MTP_DRAFTS = (1, 5)
NGRAM_DRAFTS = (0, 63)
NGRAM_MIN_MATCH = (4, 64)
DEFAULT_MTP_DRAFTS = 3
# The proposal head's default size: the lowest 32,768 token ids (docs/engine.md says why the
# lowest ids), an eighth of Qwen3.5's 248,320-row lm_head.
DEFAULT_LM_HEAD_DRAFT_TOKENS = 32768
# --spec-max-batch auto on MoE artifacts: on Qwen3.6-35B-A3B a round paid ~1.5-1.75x at batch 1
# and ~1.0-1.2x at batch 4 and 8 (bench/RESULTS.md, 2026-12-02); the engine resolves auto.
MOE_SPEC_MAX_BATCH = 3


def add_speculative_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("speculative decoding")
    group.add_argument(
        "--spec",
        choices=SPEC_BACKENDS,
        default=None,
        help="speculative backend: off, or mtp, which drafts with the artifact's "
        "multi-token-prediction head (dflash and dflash2 are not available in this build) "
        "(default: off)",
    )
    group.add_argument(
        "--draft-tokens",
        type=int,
        default=None,
        metavar="N",
        help=f"proposals per round of the --spec drafter; MTP {MTP_DRAFTS[0]}..{MTP_DRAFTS[1]} "
        f"(default with --spec mtp: {DEFAULT_MTP_DRAFTS})",
    )
    group.add_argument(
        "--lm-head-draft",
        action="store_true",
        help="MTP drafts score a reduced vocabulary (the lowest --lm-head-draft-tokens ids) "
        "instead of the full lm_head; verification still scores every token, so output is "
        "unchanged and only acceptance can drop (default: off)",
    )
    group.add_argument(
        "--lm-head-draft-tokens",
        type=int,
        default=None,
        metavar="N",
        help="token ids the --lm-head-draft proposal head scores, a positive multiple of 128 "
        f"(default: {DEFAULT_LM_HEAD_DRAFT_TOKENS}; the vocabulary size or more = the full head)",
    )
    group.add_argument(
        "--ngram-draft-tokens",
        type=int,
        default=0,
        metavar="N",
        help="n-gram copy proposals per round, copied from the request's own prompt and output "
        f"when its last --ngram-min-match tokens recur, {NGRAM_DRAFTS[0]}..{NGRAM_DRAFTS[1]}; "
        "0 disables (default: 0)",
    )
    group.add_argument(
        "--ngram-min-match",
        type=int,
        default=12,
        metavar="N",
        help="matched tokens an n-gram proposal needs, "
        f"{NGRAM_MIN_MATCH[0]}..{NGRAM_MIN_MATCH[1]} (default: 12)",
    )
    group.add_argument(
        "--spec-max-batch",
        type=_batch_limit,
        default=-1,
        metavar="N|auto",
        help="draft only while a step decodes at most N rows; above it rows decode one token a "
        "step (output unchanged), and drafting resumes when the batch shrinks; 0 = no limit. "
        f"auto: {MOE_SPEC_MAX_BATCH} on MoE models, whose verification rounds read many more "
        "experts than a plain step, no limit on dense ones (default: auto)",
    )


def _batch_limit(text: str) -> int:
    if text == "auto":
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a row count, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be auto, 0 or a positive row count, got {value}")
    return value


def check_speculative_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses bad combinations with parser.error and resolves --draft-tokens for --spec."""
    if args.spec == "off":  # the spec's spelling of no speculative backend
        args.spec = None
    if args.spec in ("dflash", "dflash2"):
        parser.error(
            f"--spec {args.spec} is not available in this build (DFlash drafters); "
            "use --spec mtp or n-gram drafting (--ngram-draft-tokens)"
        )
    if args.draft_tokens is not None and args.spec is None:
        parser.error("--draft-tokens requires --spec")
    if args.spec == "mtp":
        if args.draft_tokens is None:
            args.draft_tokens = DEFAULT_MTP_DRAFTS
        low, high = MTP_DRAFTS
        if not low <= args.draft_tokens <= high:
            parser.error(
                f"--draft-tokens must be {low}..{high} with --spec mtp, got {args.draft_tokens}"
            )
    if args.lm_head_draft and args.spec != "mtp":
        parser.error("--lm-head-draft drafts for the MTP head: it requires --spec mtp")
    if args.lm_head_draft_tokens is not None:
        if not args.lm_head_draft:
            parser.error("--lm-head-draft-tokens requires --lm-head-draft")
        if args.lm_head_draft_tokens <= 0 or args.lm_head_draft_tokens % 128:
            parser.error(
                "--lm-head-draft-tokens must be a positive multiple of 128, "
                f"got {args.lm_head_draft_tokens}"
            )
    low, high = NGRAM_DRAFTS
    if not low <= args.ngram_draft_tokens <= high:
        parser.error(f"--ngram-draft-tokens must be {low}..{high}, got {args.ngram_draft_tokens}")
    low, high = NGRAM_MIN_MATCH
    if not low <= args.ngram_min_match <= high:
        parser.error(f"--ngram-min-match must be {low}..{high}, got {args.ngram_min_match}")


def speculative_engine_fields(args: argparse.Namespace) -> dict[str, int]:
    """The EngineConfig fields the flags select."""
    return {
        "mtp_draft_tokens": args.draft_tokens if args.spec == "mtp" else 0,
        "ngram_draft_tokens": args.ngram_draft_tokens,
        "ngram_min_match": args.ngram_min_match,
        "spec_max_batch": args.spec_max_batch,
        "lm_head_draft_tokens": (args.lm_head_draft_tokens or DEFAULT_LM_HEAD_DRAFT_TOKENS)
        if args.lm_head_draft
        else 0,
    }
