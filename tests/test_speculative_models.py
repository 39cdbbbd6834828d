"""Speculative decoding on random-weight artifacts: a Qwen3.5 hybrid and a Qwen3.5 MoE model
with an MTP head (MTP drafting, n-gram copies, both) and a llama model (n-gram copies).

Greedy output with speculation equals greedy output without it over several prompts, batched
requests, and stops / max_tokens that land inside rounds. A draft oracle with injected
rejections exercises the hybrid rollback: every rejected round must leave the GDN conv and
recurrent state (and the KV) of exactly the accepted prefix, or the next tokens differ."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.tokenizer import Tokenizer
from toy_engine import collect, run_one, submit_ok

GREEDY = {"temperature": 0.0, "ignore_eos": True}
SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=400,
    mtp_num_hidden_layers=1,
)
CONFIGS = {
    "qwen3_5": dict(SMALL, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text"),
    "qwen3_5_moe": {
        **{k: v for k, v in SMALL.items() if k != "intermediate_size"},
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "tie_word_embeddings": True,
    },
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 400,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
}
VOCAB = 400


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def artifact(request, tmp_path_factory) -> tuple[str, Path, list[bytes]]:
    path = make_random_artifact(
        CONFIGS[request.param],
        tmp_path_factory.mktemp("spec") / "a.ninfer",
        seed=8,
        dtype="f32",
        tokenizer="synthetic",
    )
    table = Tokenizer(read_header(path).resource("tokenizer.json")).token_bytes()
    return request.param, path, table


def _engine(artifact, lanes: int = 1, **spec):
    _, path, table = artifact
    options = _core.EngineOptions(max_concurrency=lanes, max_context=256, prefill_chunk=16, **spec)
    return _core.Engine.open(str(path), options, table, threads=1)


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    prompts = []
    for n in (5, 23, 40):
        prompts.append([rng.randrange(VOCAB) for _ in range(n)])
    motif = [rng.randrange(VOCAB) for _ in range(9)]
    prompts.append(motif * 4)  # copy-heavy: n-gram proposals exist
    return prompts


def _drafters(architecture: str) -> list[dict]:
    ngram = [{"ngram_draft_tokens": 4, "ngram_min_match": 4}]
    if architecture == "llama":
        return ngram
    return (
        [{"mtp_draft_tokens": k} for k in (1, 2, 3, 5)]
        # --lm-head-draft: the head proposes among ids 0..127 only; the target still decides.
        + [{"mtp_draft_tokens": k, "lm_head_draft_tokens": 128} for k in (1, 3)]
        + ngram
        + [{"mtp_draft_tokens": 2, "ngram_draft_tokens": 6, "ngram_min_match": 4}]
    )


def _run_all(engine, prompts, max_tokens, **kw) -> list:
    ids = [submit_ok(engine, p, max_tokens, **kw) for p in prompts]
    outcomes = collect(engine, ids, timeout=120)
    return [outcomes[i] for i in ids]


def test_greedy_with_speculation_equals_greedy_without(artifact):
    architecture = artifact[0]
    prompts = _prompts()
    plain = _run_all(_engine(artifact, lanes=4), prompts, 24, **GREEDY)
    for spec in _drafters(architecture):
        engine = _engine(artifact, lanes=4, **spec)
        got = _run_all(engine, prompts, 24, **GREEDY)
        for a, b in zip(got, plain, strict=True):
            assert a.tokens == b.tokens, spec
            assert a.final.completion_tokens == b.final.completion_tokens == 24
        if "mtp_draft_tokens" in spec:  # the head always drafts; copies need a recurrence
            stats = engine.stats()
            assert stats["spec_rounds"] > 0 and stats["spec_draft_tokens"] > 0, spec
            assert all(o.final.draft_n > 0 for o in got)


def test_stops_and_max_tokens_inside_rounds(artifact):
    architecture = artifact[0]
    prompt = _prompts()[1]
    reference = run_one(_engine(artifact), prompt, 30, **GREEDY).tokens
    spec = _drafters(architecture)[-1] if architecture != "llama" else _drafters(architecture)[0]
    cases = [
        {"max_tokens": 7},
        {"max_tokens": 30, "stop_token_ids": [reference[11]]},
        {"max_tokens": 30, "min_tokens": 12, "stop_token_ids": [reference[5]]},
    ]
    for case in cases:
        kw = dict(case)
        max_tokens = kw.pop("max_tokens")
        plain = run_one(_engine(artifact), prompt, max_tokens, **GREEDY, **kw)
        # The oracle proposes the true continuation, so stops land inside accepted rounds.
        got = run_one(
            _engine(artifact, **spec), prompt, max_tokens, draft_oracle=reference, **GREEDY, **kw
        )
        assert got.tokens == plain.tokens, case
        assert got.text == plain.text, case
        assert got.final.finish_reason == plain.final.finish_reason, case
        assert got.final.completion_tokens == plain.final.completion_tokens, case


@pytest.mark.parametrize("reject_every", [1, 2, 4])
def test_rollback_after_rejections_is_exact(artifact, reject_every):
    prompt = _prompts()[2]
    plain = run_one(_engine(artifact), prompt, 40, **GREEDY)
    oracle = [
        t if (i % (reject_every + 1)) else (t + 7) % VOCAB for i, t in enumerate(plain.tokens)
    ]
    engine = _engine(artifact, ngram_draft_tokens=5, ngram_min_match=4)
    got = run_one(engine, prompt, 40, draft_oracle=oracle, **GREEDY)
    assert got.tokens == plain.tokens
    assert 0 < got.final.draft_n_accepted < got.final.draft_n
    # Rounds advanced by more than one token: fewer events than tokens.
    assert len([ev for ev in got.events if ev.token_ids]) < len(got.tokens)


def test_seeded_sampling_with_speculation_gives_the_same_tokens(artifact):
    architecture = artifact[0]
    prompt = _prompts()[3]
    kw = dict(temperature=0.8, top_k=40, top_p=0.9, presence_penalty=0.2, ignore_eos=True)
    spec = _drafters(architecture)[-1]
    for seed in (1, 2, 3):
        plain = run_one(_engine(artifact), prompt, 20, seed=seed, **kw)
        got = run_one(_engine(artifact, **spec), prompt, 20, seed=seed, **kw)
        assert got.tokens == plain.tokens, seed


def test_sampling_with_the_proposal_head_keeps_the_target_distribution(artifact):
    """Two-sample chi-square on the first two sampled tokens (top-k 3, so 9 cells), plain
    decoding against MTP with a 128-id proposal head. The second token is the first verified
    row: a proposal outside the target's top-k, or outside the subset the head scores, has
    draft probability 0 for what the target samples, and rejection resamples from p. (On
    random weights the head's proposals are nearly always rejected here; the accepting branch
    of the same rule is checked with oracle proposals in test_speculative_toy.py.)"""
    if artifact[0] != "qwen3_5":
        pytest.skip("one hybrid model suffices (the sampler is the engine's, not the model's)")
    prompt, draws = _prompts()[0], 600
    kw = dict(temperature=1.0, top_k=3, ignore_eos=True)
    samples = []
    for offset, spec in ((0, {}), (draws, {"mtp_draft_tokens": 2, "lm_head_draft_tokens": 128})):
        engine = _engine(artifact, lanes=8, **spec)
        got = []
        for begin in range(offset, offset + draws, 20):  # disjoint seeds: independent samples
            # Three tokens, so that the round after the first one has room for a proposal.
            ids = [submit_ok(engine, prompt, 3, seed=s, **kw) for s in range(begin, begin + 20)]
            got += [tuple(o.tokens[:2]) for o in collect(engine, ids, timeout=120).values()]
        if spec:
            assert engine.stats()["spec_rounds"] > 0
        samples.append(got)
    cells = sorted(set(samples[0]) | set(samples[1]))
    assert 3 <= len(cells) <= 9
    chi2 = 0.0
    for cell in cells:
        a, b = samples[0].count(cell), samples[1].count(cell)
        chi2 += (a - b) ** 2 / (a + b)  # equal sample sizes: sum (a - b)^2 / (a + b)
    # p > 1e-3 at up to 8 degrees of freedom (26.1); fewer cells only lower the bound needed.
    assert chi2 < 26.1, (chi2, cells)


def test_mtp_needs_an_mtp_head(artifact):
    if artifact[0] != "llama":
        pytest.skip("has an MTP head")
    with pytest.raises(ValueError, match="MTP head"):
        _engine(artifact, mtp_draft_tokens=2)


def test_draft_wait_of_constrained_batches_is_counted_apart(artifact):
    """ninfer_constraint_draft_wait_seconds: the MTP head's traversals in batches with a
    constrained request (their masks wait on the drafts) are counted, as part of device wait;
    without a constraint the counter stays at zero."""
    if artifact[0] != "qwen3_5":
        pytest.skip("needs an MTP head; one hybrid model suffices")
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    prompt = _prompts()[1]
    free = _engine(artifact, mtp_draft_tokens=2)
    run_one(free, prompt, 12, **GREEDY)
    assert free.stats()["spec_rounds"] > 0
    assert free.stats()["constraint_draft_wait_seconds"] == 0
    engine = _engine(artifact, mtp_draft_tokens=2)
    grammar = engine.compile_grammar("json_schema", schema)
    plain = _engine(artifact)
    greedy = {"temperature": 0.0}  # a constrained request ends at EOS
    expected = run_one(plain, prompt, 12, constraint=plain.compile_grammar("json_schema", schema),
                       **greedy)  # fmt: skip
    got = run_one(engine, prompt, 12, constraint=grammar, **greedy)
    assert got.tokens == expected.tokens
    stats = engine.stats()
    assert 0 < stats["constraint_draft_wait_seconds"] <= stats["device_wait_seconds"]
