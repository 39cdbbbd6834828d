"""The `ninfer-serve` option table: parsing, range checks, and refusal of unbuilt features."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ninfer.server.speculative_options import add_speculative_arguments, check_speculative_arguments

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")

# Options of the serving contract whose features this build does not have yet. They are
# parsed only to be refused by name; silently accepting them would promise behaviour.
# (flag, takes a value, feature)
UNAVAILABLE_OPTIONS: tuple[tuple[str, bool, str], ...] = (
    ("--rope-yarn-factor", True, "runtime YaRN scaling"),
    ("--use-original-int8-prefill-kernel", False, "the original INT8-KV prompt kernel"),
    ("--prefill-8bit-pv", False, "quantized-KV prompt kernels"),
    ("--no-prefill-8bit-pv", False, "quantized-KV prompt kernels"),
    ("--use-original-nvfp4-prefill-kernel", False, "the original NVFP4-KV prompt kernel"),
    ("--prefill-split-workspace-mib", True, "split-KV prompt attention"),
    ("--context-cost-presets", True, "context-cost presets"),
    ("--media-cache-mib", True, "media input"),
    ("--media-live-mib", True, "media input"),
    ("--media-preprocess-threads", True, "media input"),
    ("--draft-tree-nodes", True, "speculative decoding"),
    ("--draft-tree-paths", True, "speculative decoding"),
    ("--ngram-archive-mib", True, "n-gram drafting"),
    ("--ngram-session-mib", True, "n-gram drafting"),
    ("--ngram-native-sessions", False, "n-gram drafting"),
    ("--vision", False, "vision input"),
    ("--vision-offload", True, "vision input"),
    ("--vision-max-merged", True, "vision input"),
)


# Values of those options that ask for nothing this build lacks: the spec's default, or a
# setting that turns the feature off. Command lines copied from the spec's examples carry
# them, so they are accepted (and named in a startup notice) instead of refused.
NO_OP_VALUES: dict[str, tuple[str, ...]] = {
    "--rope-yarn-factor": ("1", "1.0"),  # the default: no YaRN scaling
    "--ngram-archive-mib": ("0",),  # the default: no n-gram archive
    "--vision-offload": ("off",),  # the default, and there is no vision tower to offload
}


# Options of the original continuation/checkpoint cache, which NInfer does not have: the hybrid
# prefix cache is the only one. Refused with that reason rather than "not available yet".
ORIGINAL_CACHE_OPTIONS: tuple[tuple[str, bool], ...] = (
    ("--use-original-prefix-caching", False),
    ("--device-state-slots", True),
)
# Options of the hybrid cache that --no-prefix-reuse rejects.
HYBRID_CACHE_OPTIONS = (
    "prefix_cache_file",
    "device_snapshot_slots",
    "cache_taps_per_request",
    "cache_tap_ladder",
    "cache_tap_min_gap",
)


class _RefuseOriginalCache(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        parser.error(
            f"{option_string} belongs to the original prefix cache, which this server does not "
            "have: NInfer always uses the hybrid prefix cache (content-addressed 64-token KV "
            "blocks and state snapshots); size it with --kv-capacity, --device-snapshot-slots "
            "and the --cache-tap-* options, or turn reuse off with --no-prefix-reuse"
        )


# --kv-dtype: the KV formats this build stores, and those of the serving contract it does not
# (the vector-quantized and mixed-width ones), refused by name.
KV_DTYPES = ("bf16", "fp8", "int8", "nvfp4")
UNBUILT_KV_DTYPES = ("k8v4", "vq2", "k4v2")


def _kv_dtype(text: str) -> str:
    if text in KV_DTYPES:
        return text
    built = ", ".join(KV_DTYPES)
    if text in UNBUILT_KV_DTYPES:
        raise argparse.ArgumentTypeError(
            f"{text} is not available in this build; the KV formats it stores are {built}"
        )
    raise argparse.ArgumentTypeError(f"expected one of {built}, got {text!r}")


def _kv_capacity(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected `auto` or a token count, got {text!r}"
        ) from None
    if value < 64:
        raise argparse.ArgumentTypeError(f"{value} is out of range (at least 64 tokens, or auto)")
    return value


def _cache_file(text: str) -> str:
    path = os.path.abspath(text)  # relative to the launch directory
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path!r} is a folder, not a file")
    return path


def _host_context_mib(text: str) -> int:
    """--host-context-mib: decimal MiB (`0.5` allowed) as a whole number of bytes."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected 0 or a positive number of MiB")
    size = value * (1 << 20)
    if size != size.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text} MiB is not a whole number of bytes")
    return int(size)


DEFAULT_HOST_CONTEXT_BYTES = 8192 << 20


class _Refuse(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, feature: str, **kwargs: Any):
        self.feature = feature
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        if isinstance(values, str) and values in NO_OP_VALUES.get(option_string or "", ()):
            accepted = getattr(namespace, "no_op_options", None) or []
            namespace.no_op_options = [*accepted, f"{option_string} {values}"]
            return
        parser.error(f"{option_string} is not available in this build ({self.feature})")


def _int_range(low: int, high: int | None = None):  # noqa: ANN202
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({bounds})")
        return value

    return parse


def _float_range(low: float, high: float):  # noqa: ANN202
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low}..{high})")
        return value

    return parse


def _device(text: str) -> str:
    if text == "cpu" or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected `cpu` or a CUDA device index, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ninfer-serve",
        usage="ninfer-serve [MODEL] [options]",
        description="Serve one model over OpenAI- and Anthropic-compatible HTTP.",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="With no MODEL, the embedded SmolLM2-135M-Instruct is converted once into "
        "$NINFER_CACHE_DIR (default ~/.cache/ninfer) and served.",
    )
    add = parser.add_argument
    add(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a .ninfer artifact, a .gguf file or a Hugging Face folder (the latter two are "
        "converted once into the cache); default: the embedded SmolLM2-135M-Instruct",
    )
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    net.add_argument(
        "--port", type=_int_range(1, 65535), default=8080, help="listen port (default: 8080)"
    )
    net.add_argument(
        "--api-key",
        metavar="KEY",
        help="require this value as a bearer token or x-api-key header (default: unset)",
    )
    net.add_argument(
        "--cors", action="store_true", help="permissive browser CORS headers (default: off)"
    )
    net.add_argument(
        "--max-request-mib",
        type=_int_range(1),
        default=384,
        metavar="N",
        help="request body limit before JSON parsing (default: 384)",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-id",
        metavar="ID",
        help="public model alias (default: the artifact's metadata.name, else its architecture)",
    )
    model.add_argument(
        "--chat-template",
        metavar="FILE",
        help="Jinja chat template replacing the artifact's (default: the artifact's template)",
    )
    model.add_argument(
        "--device",
        type=_device,
        default=None,
        metavar="N|cpu",
        help="CUDA device index, or cpu (default: 0 when this build has CUDA and a device, "
        "else cpu)",
    )
    model.add_argument(
        "--load-format",
        choices=("auto", "dummy"),
        default="auto",
        help="auto: the artifact's weights; dummy: seeded random weights made by the engine on "
        "the device from the artifact's header alone (benchmarks; serves header-only "
        "artifacts; the seed is --seed, else 0) (default: auto)",
    )
    model.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=_int_range(1, 8),
        default=1,
        metavar="N",
        help="split the model over N ranks Megatron-style (heads, MLP columns, vocabulary); "
        "ranks are threads of this process (--device cpu in this build) (default: 1)",
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--max-context",
        type=_int_range(1),
        default=8192,
        metavar="N",
        help="context ceiling of each sequence, prompt plus output (default: 8192)",
    )
    engine.add_argument(
        "--max-concurrency",
        type=_int_range(1, 8),
        default=1,
        metavar="N",
        help="resident execution lanes, 1..8 (default: 1)",
    )
    engine.add_argument(
        "--max-pending-requests",
        type=_int_range(0),
        default=16,
        metavar="N",
        help="requests allowed to wait for a lane (default: 16)",
    )
    engine.add_argument(
        "--pending-timeout-ms",
        type=_int_range(0),
        default=30000,
        metavar="N",
        help="longest wait for a lane before HTTP 503; 0 waits forever (default: 30000)",
    )
    engine.add_argument(
        "--prefill-chunk",
        type=_int_range(1),
        default=1024,
        metavar="N",
        help="prompt tokens processed per prefill step (default: 1024)",
    )
    cache = parser.add_argument_group("memory and prefix cache")
    cache.add_argument(
        "--kv-capacity",
        type=_kv_capacity,
        default=None,
        metavar="N|auto",
        help="shared KV pool in tokens, or auto: the memory the model leaves free less "
        "--vram-headroom-mib (CPU: at most half the available RAM) (default: auto; "
        "lanes x --max-context with --no-prefix-reuse)",
    )
    cache.add_argument(
        "--kv-dtype",
        type=_kv_dtype,
        default="bf16",
        metavar="|".join(KV_DTYPES),
        help="KV-cache storage: bf16 (unquantized), fp8 (e4m3), int8 or nvfp4 (e2m1 with e4m3 "
        "scales per 16 values), each quantized format with one f32 scale per token and KV head "
        "(default: bf16)",
    )
    cache.add_argument(
        "--vram-headroom-mib",
        type=_int_range(0),
        default=None,
        metavar="N",
        help="memory --kv-capacity auto leaves free; requires auto (default: 1024)",
    )
    cache.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="turn cross-request prefix reuse off; pause/replay under memory pressure stays "
        "(default: prefix reuse on)",
    )
    cache.add_argument(
        "--host-context-mib",
        type=_host_context_mib,
        default=None,
        dest="host_context_bytes",
        metavar="N",
        help="host memory in MiB (decimals allowed) that KV blocks and state snapshots evicted "
        "from the device share; a hit restores them from there; 0 keeps the cache on the "
        "device only (default: 8192)",
    )
    cache.add_argument(
        "--prefix-cache-file",
        type=_cache_file,
        default=None,
        metavar="PATH",
        help="restore the prefix cache from PATH at startup when it exists and matches this "
        "model and build; save it there when the server stops (to PATH.tmp, then renamed) "
        "(default: off)",
    )
    cache.add_argument(
        "--device-snapshot-slots",
        type=_int_range(1, 64),
        default=None,
        metavar="N",
        help="hybrid models: device state snapshot slots, 1..64 "
        "(default: max-concurrency + 1; + 2 without a host tier)",
    )
    cache.add_argument(
        "--cache-taps-per-request",
        type=_int_range(0, 64),
        default=None,
        metavar="N",
        help="hybrid models: prefill state snapshots per request, 0..64 "
        "(default: 8; 2 without a host tier)",
    )
    cache.add_argument(
        "--cache-tap-ladder",
        type=_int_range(64),
        default=None,
        metavar="N",
        help="hybrid models: ladder base G, taps at prompt - G*2^k "
        "(default: max(4096, 2 * prefill-chunk))",
    )
    cache.add_argument(
        "--cache-tap-min-gap",
        type=_int_range(1),
        default=None,
        metavar="N",
        help="hybrid models: minimum tokens between taps (default: max(1024, prefill-chunk))",
    )
    for flag, takes_value in ORIGINAL_CACHE_OPTIONS:
        cache.add_argument(
            flag,
            action=_RefuseOriginalCache,
            nargs="?" if takes_value else 0,
            metavar="VALUE",
            help="original prefix cache: refused, NInfer has only the hybrid cache "
            "(default: refused)",
        )
    engine.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="run every CUDA decode step eagerly instead of replaying captured CUDA graphs "
        "(default: graphs on)",
    )
    gen = parser.add_argument_group("generation defaults")
    gen.add_argument(
        "--default-max-tokens",
        type=_int_range(1),
        default=8192,
        metavar="N",
        help="output limit when a request sets none (default: 8192)",
    )
    gen.add_argument(
        "--max-output-tokens",
        type=_int_range(1),
        default=None,
        metavar="N",
        help="cap every request's output budget at N tokens, whatever it asks for; a request "
        "that reaches it ends with finish reason length (default: no cap)",
    )
    gen.add_argument(
        "--no-thinking",
        action="store_true",
        help="render prompts with thinking disabled by default (default: thinking on)",
    )
    gen.add_argument(
        "--preserve-thinking",
        action="store_true",
        help="keep earlier assistant reasoning in prompts by default (default: off)",
    )
    gen.add_argument(
        "--reasoning-effort",
        choices=("none", "minimal", "low", "medium", "high", "xhigh", "max"),
        metavar="LEVEL",
        help="default reasoning_effort for requests that give none; none = thinking off "
        "(default: the template's own)",
    )
    gen.add_argument(
        "--default-thinking-budget",
        type=_int_range(1),
        metavar="N",
        help="thinking-token cap for requests that start in thinking mode; at the cap the "
        "early-close guidance and </think> are committed and the answer follows "
        "(default: unset)",
    )
    gen.add_argument(
        "--thinking-budget-message",
        metavar="S",
        help="text committed when a thinking budget ends thinking, instead of Qwen's "
        "early-close guidance; </think> is appended when S lacks it (default: Qwen's guidance)",
    )
    gen.add_argument(
        "--tolerant-tool-calls",
        action="store_true",
        help="recover complete tool calls cut by a malformed wrapper, a trailing suffix or the "
        "output budget, and calls stranded in unclosed thinking, instead of returning the "
        "markup as text (default: off)",
    )
    gen.add_argument(
        "--usage-chunk-choice",
        action="store_true",
        help="give the streamed usage chunk a zero-delta choice, for strict client parsers "
        "(default: off)",
    )
    responses = parser.add_argument_group("Responses API store")
    responses.add_argument(
        "--response-store-max-records",
        type=_int_range(1),
        default=1024,
        metavar="N",
        help="stored Responses kept for retrieval and previous_response_id, least recently "
        "used evicted first (default: 1024)",
    )
    responses.add_argument(
        "--response-store-max-mib",
        type=_int_range(1),
        default=256,
        metavar="N",
        help="byte budget of the stored Responses (default: 256)",
    )
    sampler = parser.add_argument_group(
        "sampling (precedence: artifact defaults < these flags < request fields < --greedy)"
    )
    sampler.add_argument(
        "--temperature", type=_float_range(0.0, 2.0), metavar="F", help="default: unset"
    )
    sampler.add_argument("--top-p", type=_float_range(0.0, 1.0), metavar="F", help="default: unset")
    sampler.add_argument(
        "--top-k", type=_int_range(0, 20), metavar="N", help="0..20, 0 = off (default: unset)"
    )
    sampler.add_argument("--min-p", type=_float_range(0.0, 1.0), metavar="F", help="default: unset")
    sampler.add_argument(
        "--presence-penalty", type=_float_range(-2.0, 2.0), metavar="F", help="default: unset"
    )
    sampler.add_argument(
        "--frequency-penalty", type=_float_range(-2.0, 2.0), metavar="F", help="default: unset"
    )
    sampler.add_argument(
        "--seed",
        type=_int_range(-(1 << 63), (1 << 63) - 1),
        metavar="N",
        help="seed for requests that give none (default: a fresh random seed per request)",
    )
    sampler.add_argument(
        "--greedy", action="store_true", help="force argmax for every request (default: off)"
    )
    logging_group = parser.add_argument_group("logging")
    logging_group.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="stderr verbosity: " + "|".join(LOG_LEVELS) + " (default: info)",
    )
    logging_group.add_argument(
        "--log-stats-interval-ms",
        type=_int_range(0),
        default=5000,
        metavar="N",
        help="aggregate throughput record every N ms, idle intervals omitted; 0 disables it "
        "(default: 5000)",
    )
    logging_group.add_argument(
        "--log-stats-panel",
        choices=("on", "off"),
        default="on",
        help="pin the session statistics panel beneath the records on an interactive "
        "terminal (default: on)",
    )
    logging_group.add_argument(
        "--log-colours",
        choices=("on", "off"),
        default="off",
        help="colour the console statistics lines; never applies to redirected output "
        "(default: off)",
    )
    logging_group.add_argument(
        "--request-log-jsonl",
        metavar="FILE",
        help="append machine-readable server and request records, one JSON object per line "
        "(default: disabled)",
    )
    logging_group.add_argument(
        "--request-log-max-mib",
        type=_int_range(1),
        metavar="N",
        help="rotate the request log once it reaches N MiB; requires --request-log-jsonl "
        "(default: one file without a size limit)",
    )
    logging_group.add_argument(
        "--request-log-keep",
        type=_int_range(0, 1000),
        metavar="N",
        help="rotated request-log files kept, 0..1000; requires --request-log-max-mib (default: 4)",
    )
    add_speculative_arguments(parser)
    later = parser.add_argument_group(
        "not available in this build (refused if given, except a value that changes nothing)"
    )
    for flag, takes_value, feature in UNAVAILABLE_OPTIONS:
        no_op = NO_OP_VALUES.get(flag)
        later.add_argument(
            flag,
            action=_Refuse,
            feature=feature,
            nargs="?" if takes_value else 0,
            metavar="VALUE",
            help=f"{feature}: not available in this build"
            + (f" (accepted: {', '.join(no_op)})" if no_op else ""),
        )
    parser.set_defaults(no_op_options=[])
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.vram_headroom_mib is not None and args.kv_capacity is not None:
        parser.error("--vram-headroom-mib requires --kv-capacity auto")
    if args.tensor_parallel_size > 1 and args.device != "cpu":
        parser.error(
            "--tensor-parallel-size runs its ranks on the CPU in this build: add --device cpu "
            "(ranks over NCCL on several GPUs are not built yet)"
        )
    if args.tensor_parallel_size > 1 and getattr(args, "spec", None) == "mtp":
        parser.error("--spec mtp cannot run with --tensor-parallel-size yet (n-gram drafting can)")
    if args.tensor_parallel_size > 1 and getattr(args, "prefix_cache_file", None):
        parser.error("--prefix-cache-file cannot save a model split by --tensor-parallel-size yet")
    if args.no_prefix_reuse:
        given = [name for name in HYBRID_CACHE_OPTIONS if getattr(args, name) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            parser.error(f"{flag} configures prefix reuse, which --no-prefix-reuse turns off")
    if args.host_context_bytes is None:
        args.host_context_bytes = 0 if args.no_prefix_reuse else DEFAULT_HOST_CONTEXT_BYTES
    if args.prefix_cache_file is not None and args.host_context_bytes == 0:
        parser.error("--prefix-cache-file needs a host tier (--host-context-mib above 0)")
    if args.request_log_max_mib is not None and args.request_log_jsonl is None:
        parser.error("--request-log-max-mib requires --request-log-jsonl")
    if args.request_log_keep is not None and args.request_log_max_mib is None:
        parser.error("--request-log-keep requires --request-log-max-mib")
    if args.request_log_keep is None:
        args.request_log_keep = 4
    check_speculative_arguments(parser, args)
    return args


def process_sampling(args: argparse.Namespace) -> dict[str, float | int]:
    """The sampler flags that were given, as SamplingParams field values."""
    names = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
