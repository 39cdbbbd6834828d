"""The speculative-decoding flags of ninfer-serve: --spec, --draft-tokens and n-gram drafting.

The MTP head (`--spec mtp`) and n-gram copy drafting are served; DFlash/DFlash2 drafters, the
reduced proposal head, tree verification and the cross-request n-gram archive are not in
this build and are refused by name (options.UNAVAILABLE_OPTIONS, and --spec dflash|dflash2
here).
"""

from __future__ import annotations

import argparse

SPEC_BACKENDS = ("off", "mtp", "dflash", "dflash2")
MTP_DRAFTS = (1, 5)
NGRAM_DRAFTS = (0, 63)
NGRAM_MIN_MATCH = (4, 64)
DEFAULT_MTP_DRAFTS = 3


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
    }
