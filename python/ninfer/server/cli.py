"""`ninfer-serve`: load one model, warm it up, then serve it over HTTP in this process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ninfer.default_model import ModelSourceError, resolve_model
from ninfer.engine_types import EngineConfig, EngineUnavailable
from ninfer.protocols.served_model import ModelSetupError, ServedModel, load_served_model
from ninfer.server.app import NInferApp
from ninfer.server.config import AppConfig
from ninfer.server.device_failure import DeviceFailureExit
from ninfer.server.embedded import serve
from ninfer.server.logs import configure_logging
from ninfer.server.options import parse_args, process_sampling
from ninfer.server.request_log import RequestLog, RequestLogError
from ninfer.server.server_start import server_start_record
from ninfer.server.speculative_options import speculative_engine_fields
from ninfer.server.startup_heap import freeze_startup_heap
from ninfer.server.stats_panel import StatsPanel, panel_wanted
from ninfer.server.telemetry import Telemetry
from ninfer.server.throughput import ThroughputReporter

log = logging.getLogger("ninfer.server")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # for server_start, redacted
    configure_logging(args.log_level)
    for option in args.no_op_options:
        log.info("accepted `%s`: it asks for nothing this build lacks, so it has no effect", option)
    try:
        return _main(args)
    except KeyboardInterrupt:  # Ctrl+C before the server was ready: one press ends startup
        return _startup_interrupted()


def _startup_interrupted() -> int:
    log.info("startup interrupted")
    return 130


def _main(args: argparse.Namespace) -> int:
    try:
        check_address(args.host, args.port)  # fail before minutes of loading, not after
        template = _read_template(args.chat_template)
        artifact = resolve_model(args.model)
        request_log = _open_request_log(args, artifact)
    except (ModelSourceError, RequestLogError, OSError) as exc:
        log.error("%s", exc)
        return 1
    device_exit = DeviceFailureExit(_exit_without_teardown)
    try:
        reached_ready = asyncio.run(_run(args, artifact, template, request_log, device_exit))
    except (ModelSetupError, ModelSourceError, EngineUnavailable, OSError) as exc:
        log.error("%s", exc)
        return device_exit.status if device_exit.failed else 1
    if device_exit.failed:
        _exit_without_teardown(device_exit.status)  # a supervisor restarts the server
    if not reached_ready:
        return _startup_interrupted()
    _exit_without_teardown(0)


def _exit_without_teardown(code: int) -> NoReturn:
    # The engine is closed and "server stopped" is logged; what remains is interpreter
    # finalization, during which Granian's Rust threads can still be unwinding connections
    # and panic into stderr. Nothing is left to clean up, so leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_address(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def _open_request_log(args: argparse.Namespace, artifact: Path) -> RequestLog | None:
    if args.request_log_jsonl is None:
        return None
    return RequestLog(
        args.request_log_jsonl,
        artifact=artifact,
        max_mib=args.request_log_max_mib,
        keep=args.request_log_keep,
    )


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelSourceError(f"cannot read --chat-template {path}: {exc}") from exc


def engine_config(args: argparse.Namespace) -> EngineConfig:
    kv_capacity = getattr(args, "kv_capacity", None)
    no_reuse = bool(getattr(args, "no_prefix_reuse", False))
    if kv_capacity is None and no_reuse:
        # Without reuse nothing is retained: every lane reaching the ceiling is the need.
        kv_capacity = args.max_concurrency * args.max_context
    headroom = getattr(args, "vram_headroom_mib", None)
    optional = {
        "snapshot_slots": getattr(args, "device_snapshot_slots", None),
        "taps_per_request": getattr(args, "cache_taps_per_request", None),
        "tap_ladder": getattr(args, "cache_tap_ladder", None),
        "tap_min_gap": getattr(args, "cache_tap_min_gap", None),
    }
    return EngineConfig(
        max_concurrency=args.max_concurrency,
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
        max_pending_requests=args.max_pending_requests,
        pending_timeout_ms=args.pending_timeout_ms,
        device=resolve_device(args.device),
        kv_capacity=kv_capacity or 0,
        kv_dtype=getattr(args, "kv_dtype", "bf16"),
        vram_headroom_mib=1024 if headroom is None else headroom,
        prefix_reuse=not no_reuse,
        host_context_bytes=getattr(args, "host_context_bytes", None) or 0,
        prefix_cache_file=getattr(args, "prefix_cache_file", None),
        **{key: value for key, value in optional.items() if value is not None},
        **speculative_engine_fields(args),
        cuda_graphs=not args.no_cuda_graph,
        random_weights_seed=dummy_weights_seed(args),
        tensor_parallel_size=args.tensor_parallel_size,
    )


def warmup_shape(config: EngineConfig) -> tuple[int, int]:
    """(prompt tokens, output tokens) of the start-up generation. On a GPU: one whole
    prefill chunk and 4 tokens, so the first request finds the chunk's kernels loaded, its
    GEMM choices made, the scratch buffers at prefill size and the batch-1 decode graph
    captured (a graph is captured the second time its step shape is seen). Elsewhere one
    token and 2, which is all the CPU backend needs."""
    if config.device.startswith("cuda"):
        return config.prefill_chunk, 4
    return 1, 2


def dummy_weights_seed(args: argparse.Namespace) -> int | None:
    """The seed of `--load-format dummy` weights (`--seed`, else 0), None for real weights."""
    if args.load_format != "dummy":
        return None
    return 0 if args.seed is None else args.seed


def resolve_device(flag: str | None) -> str:
    if flag == "cpu":
        return "cpu"
    if flag is not None:
        return f"cuda:{flag}"
    return "cuda:0" if _cuda_available() else "cpu"


def _cuda_available() -> bool:
    try:
        from ninfer import _core
    except ImportError:
        return False
    probe = getattr(_core, "cuda_device_count", None)
    return bool(probe and probe() > 0)


async def _run(
    args: argparse.Namespace,
    artifact: Path,
    template: str | None,
    request_log: RequestLog | None,
    device_exit: DeviceFailureExit | None = None,
) -> bool:
    """Load, warm up and serve until stopped; False when stopped before it was ready."""
    from ninfer.engine import AsyncEngine

    config = engine_config(args)
    log.info("loading %s (device %s)", artifact, config.device)
    if config.random_weights_seed is not None:
        log.info(
            "dummy weights: seeded random values (seed %d), not a trained model",
            config.random_weights_seed,
        )
    if config.tensor_parallel_size > 1:
        log.info(
            "tensor parallel: the model split over %d ranks (threads of this process)",
            config.tensor_parallel_size,
        )
    try:
        engine = AsyncEngine.open(str(artifact), config)
    except Exception as exc:  # a bad file or an unavailable device: say which, then exit
        raise ModelSetupError(f"cannot load {artifact}: {exc}") from exc
    # The grammar vocabulary builds in the background, overlapping the rest of start-up (an
    # engine without grammar support, such as a test double, has nothing to build).
    prepare_grammars = getattr(engine, "prepare_grammars", None)
    if prepare_grammars is not None:
        prepare_grammars()
    if device_exit is not None:
        engine.on_device_failure = device_exit.device_failed
    try:
        served = load_served_model(
            engine,
            model_id=args.model_id,
            chat_template=template,
            process_sampling=process_sampling(args),
            process_seed=args.seed,
            greedy=args.greedy,
            default_max_tokens=args.default_max_tokens,
            no_thinking=args.no_thinking,
            preserve_thinking=args.preserve_thinking,
            reasoning_effort=args.reasoning_effort,
            tolerant_tool_calls=args.tolerant_tool_calls,
            default_thinking_budget=args.default_thinking_budget,
            thinking_budget_message=args.thinking_budget_message,
            max_output_tokens=args.max_output_tokens,
        )
        await engine.warmup(*warmup_shape(config))
        # Long prompts encode ~15x faster once the tokenizer's tiktoken path has passed its
        # exactness check (ninfer.fast_bpe: seconds the first time a tokenizer.json is seen
        # on this machine, then remembered), so the server reports ready when it has.
        wait_fast = getattr(getattr(engine, "tokenizer", None), "wait_fast_encoder", None)
        if wait_fast is not None:
            await asyncio.to_thread(wait_fast, 60)
        frozen = freeze_startup_heap()
        log.debug("start-up heap: %d objects frozen out of full collections", frozen)
        if device_exit is not None:
            device_exit.arm_test_hook(engine)
        telemetry = Telemetry(request_log=request_log)
        if device_exit is not None:
            device_exit.telemetry = telemetry
        if request_log is not None:
            request_log.start(server_start_record(telemetry, args, artifact, served, config))
        app = NInferApp(
            served,
            AppConfig(
                api_key=args.api_key,
                cors=args.cors,
                max_request_mib=args.max_request_mib,
                usage_chunk_choice=args.usage_chunk_choice,
                response_store_max_records=args.response_store_max_records,
                response_store_max_mib=args.response_store_max_mib,
                backend=config.device,
                token_count_capacity=args.max_concurrency + args.max_pending_requests,
            ),
            on_ready=lambda: _on_ready(served, config, args, reporter, panel),
            telemetry=telemetry,
        )
        reporter = ThroughputReporter(engine, telemetry, args.log_stats_interval_ms)
        panel = _make_panel(args, telemetry, engine)
        try:
            signals = await serve(
                app,
                args.host,
                args.port,
                on_stop=app.begin_shutdown,
                is_ready=lambda: app.ready,
                debug=args.log_level in ("trace", "debug"),
                prompt=panel.set_prompt if panel is not None else None,
                on_signals=device_exit.serving if device_exit is not None else None,
            )
        except BaseException:
            if panel is not None:
                panel.stop()
            raise
        finally:
            reporter.stop()
    finally:
        await engine.close()
    signals.remove()
    if not signals.stopped_before_ready:
        log.info("server stopped")
    if panel is not None:
        panel.stop()  # left on screen as ordinary output, beneath the last record
    if request_log is not None:
        request_log.close()
    return not signals.stopped_before_ready


def _make_panel(args: argparse.Namespace, telemetry: Telemetry, engine: Any) -> StatsPanel | None:
    if not panel_wanted(args.log_stats_panel, args.log_level):
        return None
    panel = StatsPanel(
        telemetry.session,
        engine,
        colours=args.log_colours == "on",
        show_gauges=args.log_stats_interval_ms > 0,
        drafter="MTP" if getattr(args, "spec", None) == "mtp" else None,
        ngram=(getattr(args, "ngram_draft_tokens", 0) or 0) > 0,
    )
    telemetry.on_change.append(panel.refresh)
    return panel


def _on_ready(
    served: ServedModel,
    config: EngineConfig,
    args: argparse.Namespace,
    reporter: ThroughputReporter,
    panel: StatsPanel | None,
) -> None:
    _log_ready(served, config, args)
    reporter.start()
    if panel is not None:
        panel.start()


def _log_ready(served: ServedModel, config: EngineConfig, args: argparse.Namespace) -> None:
    info: dict[str, Any] = dict(served.engine.model_info)
    log.info(
        "model %s: %s, %s parameters, %s weights",
        served.public_id,
        info.get("architecture"),
        f"{info['n_params']:,}" if isinstance(info.get("n_params"), int) else "?",
        info.get("ftype"),
    )
    log.info(
        "backend %s, %d lane(s), %d pending, context ceiling %d tokens, prefill chunk %d",
        config.device,
        config.max_concurrency,
        config.max_pending_requests,
        served.max_context,
        config.prefill_chunk,
    )
    capacity = info.get("kv_capacity")
    if isinstance(capacity, int):
        log.info(
            "KV pool: %d tokens (%s, --kv-dtype %s), prefix reuse %s",
            capacity,
            "--kv-capacity" if config.kv_capacity else "auto",
            config.kv_dtype,
            "on" if config.prefix_reuse else "off",
        )
        if config.prefix_reuse:
            log.info(
                "prefix cache host tier: %s",
                f"{config.host_context_bytes / (1 << 20):g} MiB of host memory for evicted "
                "blocks and state snapshots"
                if config.host_context_bytes
                else "off (--host-context-mib 0): evicted blocks are dropped",
            )
        if capacity < config.max_context:
            log.warning(
                "the KV pool (%d tokens) is smaller than --max-context %d: requests are "
                "limited to the pool",
                capacity,
                config.max_context,
            )
    if served.max_output_tokens is not None:
        log.info("output ceiling: %d tokens per request", served.max_output_tokens)
    log.info(
        "ready: serving http://%s:%d/v1 (OpenAI base URL), http://%s:%d (Anthropic base URL)",
        args.host,
        args.port,
        args.host,
        args.port,
    )


if __name__ == "__main__":
    sys.exit(main())
