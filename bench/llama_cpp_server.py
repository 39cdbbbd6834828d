"""llama.cpp's own OpenAI-compatible HTTP server (the C++ `llama-server` code, continuous
batching), started from Python through the prebuilt `xllamacpp` wheel, for comparisons with
ninfer-serve over the same bench_serve.py workload:

    pip install xllamacpp
    python bench/llama_cpp_server.py MODEL.gguf --port 8081 --threads 2 --parallel 4 &
    python bench/bench_serve.py --port 8081 ...

Runs until SIGTERM / SIGINT. `--parallel` is llama-server's slot count (-np) and `--ctx-size`
its total context, split evenly between the slots (-c), as on llama-server's command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--threads", type=int, default=2, help="-t and -tb (default: 2)")
    parser.add_argument("--parallel", type=int, default=4, help="slots, -np (default: 4)")
    parser.add_argument("--ctx-size", type=int, default=4096, help="-c, all slots (default: 4096)")
    parser.add_argument("--batch-size", type=int, default=2048, help="-b (default: 2048)")
    parser.add_argument("--alias", default=None, help="model id served (default: file stem)")
    args = parser.parse_args(argv)

    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(args.model)
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    params.n_batch = args.batch_size
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_gpu_layers = 0
    params.model_alias = {args.alias or args.model.stem}
    print(xlc.get_system_info(), file=sys.stderr, flush=True)
    server = xlc.Server(params)
    print(f"llama.cpp server listening on {server.listening_address}", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
