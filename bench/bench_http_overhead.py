"""What the HTTP path costs per streamed token, with the model taken out.

Serves the native toy engine (no weights; every forward sleeps `--step-us`, as a model step
would take) through the real server in this process, drives it with bench_serve.py from a
second process, and reports the event loop's time per streamed token: everything above
the engine (event bridge, turn decoding, chunk rendering, SSE framing, Granian's send) that
runs on the asyncio thread. The engine's own thread and the client are not counted.

    PYTHONPATH=python python bench/bench_http_overhead.py --step-us 5000 --max-concurrency 4

"CPU" is the loop thread's CPU clock; "busy" is its wall time outside the selector's wait,
which on a loaded machine also counts time it was runnable but not running. Both include
the per-request work (prompt rendering, bench_serve's /tokenize calls): use long outputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ninfer import _core
from ninfer.convert.synthetic_tokenizer import (
    CHATML_TEMPLATE,
    synthetic_token_ids,
    synthetic_tokenizer_json,
)
from ninfer.engine import AsyncEngine
from ninfer.protocols.served_model import load_served_model
from ninfer.server.app import AppConfig, NInferApp
from ninfer.server.embedded import make_server
from ninfer.tokenizer import Tokenizer

BENCH = Path(__file__).resolve().parent


class BusyClock:
    """Wall time the loop spends outside its selector's wait."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.cpu_clock = time.pthread_getcpuclockid(threading.get_ident())  # in the loop thread
        selector = loop._selector  # type: ignore[attr-defined]
        self._select = selector.select
        self._waited = 0.0
        self._since: float | None = None  # start of the wait in progress
        self.calls = 0  # loop iterations
        self.sleeps = 0  # iterations that blocked
        selector.select = self._timed_select

    def _timed_select(self, timeout: float | None = None) -> Any:
        self._since = time.perf_counter()
        try:
            return self._select(timeout)
        finally:
            waited = time.perf_counter() - self._since
            self._waited += waited
            self.calls += 1
            self.sleeps += waited > 50e-6  # the thread really slept (was woken)
            self._since = None

    def waited(self) -> float:
        """Seconds spent waiting so far, the wait in progress included (read from any
        thread: a torn read is off by one wait at most)."""
        since = self._since
        return self._waited + (time.perf_counter() - since if since is not None else 0.0)


def toy_engine(max_concurrency: int, step_us: int) -> AsyncEngine:
    ids = synthetic_token_ids()
    eos = [ids["<|im_end|>"]]
    tokenizer = Tokenizer(synthetic_tokenizer_json(), bos_token_id=None, eos_token_ids=eos)
    options = _core.EngineOptions(
        max_concurrency=max_concurrency, max_context=8192, prefill_chunk=256, eos_ids=eos
    )
    table = tokenizer.token_bytes()
    core = _core.Engine.toy(len(table), table, options)
    core.toy_set_step_delay_us(step_us)
    header = {"metadata": {"name": "toy"}, "tokenizer": {"eos_token_ids": eos}}
    return AsyncEngine(core, tokenizer=tokenizer, header=header, chat_template=CHATML_TEMPLATE)


def serve_in_thread(engine: AsyncEngine, port: int) -> tuple[asyncio.AbstractEventLoop, Any]:
    ready = threading.Event()
    app = NInferApp(load_served_model(engine), AppConfig(), on_ready=ready.set)
    holder: dict[str, Any] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        holder["loop"], holder["server"] = loop, make_server(app, "127.0.0.1", port)
        holder["clock"] = BusyClock(loop)
        loop.run_until_complete(holder["server"].serve())

    threading.Thread(target=run, daemon=True).start()
    if not ready.wait(30):
        raise RuntimeError("the server did not start")
    return holder["loop"], holder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-us", type=int, default=5000, help="toy forward time (5000)")
    parser.add_argument("--max-concurrency", type=int, default=1, help="streams (1)")
    parser.add_argument("--output-len", type=int, default=400, help="tokens per stream (400)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (3)")
    parser.add_argument("--port", type=int, default=18411)
    args = parser.parse_args()
    engine = toy_engine(args.max_concurrency, args.step_us)
    _, holder = serve_in_thread(engine, args.port)
    clock: BusyClock = holder["clock"]
    print(
        f"toy engine, step {args.step_us} us, {args.max_concurrency} stream(s) of "
        f"{args.output_len} tokens, chat completions streamed"
    )
    for _ in range(args.rounds):
        with tempfile.NamedTemporaryFile(suffix=".json") as result:
            waited, start = clock.waited(), time.perf_counter()
            cpu = time.clock_gettime(clock.cpu_clock)
            calls, sleeps = clock.calls, clock.sleeps
            subprocess.run(
                [sys.executable, str(BENCH / "bench_serve.py"), "--port", str(args.port),
                 "--random-input-len", "16", "--random-output-len", str(args.output_len),
                 "--num-prompts", str(args.max_concurrency), "--max-concurrency",
                 str(args.max_concurrency), "--result-file", result.name],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            wall = time.perf_counter() - start
            busy = wall - (clock.waited() - waited)
            cpu = time.clock_gettime(clock.cpu_clock) - cpu
            calls, sleeps = clock.calls - calls, clock.sleeps - sleeps
            summary = json.loads(Path(result.name).read_text())
        tokens = summary["total_output_tokens"]
        print(
            f"  loop CPU {cpu / tokens * 1e6:6.1f} us/token, busy {busy / tokens * 1e6:6.1f} "
            f"us/token, {calls / tokens:.1f} iterations ({sleeps / tokens:.1f} blocking) "
            f"per token | median ITL "
            f"{summary['median_itl_ms']:.2f} ms, p99 {summary['p99_itl_ms']:.2f} ms | "
            f"{summary['output_throughput']:.0f} tok/s"
        )
    holder["server"].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
