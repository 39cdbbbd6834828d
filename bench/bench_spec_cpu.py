"""Cost of speculative rounds against plain decode on the CPU, through the engine.

A random bf16 Qwen3.5-style hybrid with an MTP head (the bench_hybrid_cpu.py dense shape plus
one MTP layer). Random weights make the head's acceptance meaningless, so acceptance is
injected: a draft oracle proposes the recorded greedy continuation with each proposal wrong
with a set probability, which fixes how many tokens a round commits while the rounds do all
their real work (verification of k + 1 positions, GDN state history and rollback). Printed
per k: ms per round, the round's cost relative to a plain decode step, tokens per second at
full acceptance and at the given per-position acceptance, and the MTP head's own cost per
round (MTP drafting with acceptance ~0, against plain decode).

Run: PYTHONPATH=python python bench/bench_spec_cpu.py [--threads N] [--tokens T]
"""

from __future__ import annotations

import argparse
import random
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


def _timed(engine, prompt, tokens, **kw) -> tuple[float, object]:
    """Decode seconds (first committed token to last, the engine's own clock) and the run."""
    outcome = run_one(engine, prompt, tokens, **kw)
    return outcome.final.predicted_ms / 1000.0, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-proposal acceptance")
    args = parser.parse_args()
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
