"""Dense models (Llama, Qwen2, Qwen3) against Hugging Face transformers on tiny random configs.

Each config is built in fp32 with transformers, saved with save_pretrained, converted to a
.ninfer artifact by the real converter and run through `_core.ModelRunner` on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ninfer import _core  # noqa: E402
from ninfer.artifact import bf16_bits_to_f32, dequantize_q8_0  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.synthetic_tokenizer import synthetic_tokenizer_json  # noqa: E402

VOCAB = 384  # covers the synthetic tokenizer's ids
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.15,  # large enough that greedy choices are not near-ties
)

CONFIGS = {
    # GQA 4:2 with Llama 3 frequency scaling and untied embeddings.
    "llama3_gqa": (
        "LlamaConfig",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    # Qwen3: per-head q/k RMSNorm, head_dim * heads != hidden, MQA, tied embeddings.
    "qwen3_mqa_tied": (
        "Qwen3Config",
        dict(
            num_key_value_heads=1,
            head_dim=32,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),
    # Qwen2: q/k/v biases.
    "qwen2_bias": (
        "Qwen2Config",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
    ),
    # YaRN scaling multiplies cos/sin by an attention factor.
    "llama_yarn": (
        "LlamaConfig",
        dict(
            num_key_value_heads=4,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=128,
            ),
        ),
    ),
}


def _build(name: str, folder: Path) -> tuple[object, Path]:
    class_name, extra = CONFIGS[name]
    config = getattr(transformers, class_name)(**BASE, **extra)
    torch.manual_seed(sum(map(ord, name)))
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    with torch.no_grad():  # nonzero norm weights and biases, so those code paths matter
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif pname.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder / "hf")
    (folder / "hf" / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    artifact = convert_source(folder / "hf", folder / f"{name}.ninfer", progress=False)
    return model, Path(artifact)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model, artifact = _build(request.param, folder)
    return request.param, model, artifact


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].double().numpy()


def _assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    scale = np.abs(ref).max()
    err = np.abs(ours.astype(np.float64) - ref).max()
    assert err <= 2e-5 * max(scale, 1.0), f"{what}: max |diff| {err:.3g} (logit scale {scale:.3g})"


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n).tolist()


def test_full_sequence_logits_match_transformers(case):
    name, model, artifact = case
    runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=256, threads=2)
    ids = _tokens(1, 150)  # spans three KV pages
    ours = runner.forward(0, 0, ids, all_logits=True)
    assert ours.shape == (len(ids), VOCAB)
    _assert_close(ours, _hf_logits(model, ids), name)
    last = runner.forward(0, 0, ids)  # rerun from 0: last-token logits only
    _assert_close(last[None], _hf_logits(model, ids)[-1:], f"{name} last row")


def _kernel_sets() -> list[str]:
    names = []
    for name in ("scalar", "avx2", "avxvnni", "avx512vnni"):
        try:
            _core.set_cpu_kernels(name)
            names.append(name)
        except RuntimeError:  # not supported by this CPU
            pass
    _core.set_cpu_kernels("auto")
    return names


@pytest.mark.parametrize("kernels", _kernel_sets())
def test_every_kernel_set_matches_transformers(case, kernels):
    name, model, artifact = case
    _core.set_cpu_kernels(kernels)
    try:
        runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=128, threads=2)
        ids = _tokens(5, 70)
        _assert_close(runner.forward(0, 0, ids, all_logits=True), _hf_logits(model, ids), kernels)
    finally:
        _core.set_cpu_kernels("auto")


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 150])
def test_chunked_prefill_equals_one_shot(case, chunk):
    name, _, artifact = case
    runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=256, threads=2)
    ids = _tokens(2, 150)
    one_shot = runner.forward(0, 0, ids, all_logits=True)
    runner.reset(0)
    parts = [
        runner.forward(0, start, ids[start : start + chunk], all_logits=True)
        for start in range(0, len(ids), chunk)
    ]
    chunked = np.concatenate(parts)
    np.testing.assert_allclose(chunked, one_shot, rtol=0, atol=1e-5 * np.abs(one_shot).max())


def test_mixed_batch_of_lanes_matches_separate_runs(case):
    """Prefill chunks and single decode tokens of different lanes in one traversal."""
    name, model, artifact = case
    runner = _core.ModelRunner(str(artifact), max_lanes=3, max_batch_tokens=256, threads=2)
    seqs = [_tokens(10 + i, n) for i, n in enumerate((90, 33, 70))]
    # Warm lanes 0 and 1 with different prefixes; lane 2 starts fresh in the mixed step.
    runner.forward(0, 0, seqs[0][:89])
    runner.forward(1, 0, seqs[1][:20])
    mixed = runner.forward_batch(
        [(0, 89, seqs[0][89:]), (1, 20, seqs[1][20:]), (2, 0, seqs[2])], all_logits=False
    )
    assert mixed.shape == (3, VOCAB)
    for row, ids in enumerate(seqs):
        _assert_close(mixed[row : row + 1], _hf_logits(model, ids)[-1:], f"{name} lane {row}")


def test_greedy_generation_matches_transformers(case):
    name, model, artifact = case
    prompt = _tokens(3, 24)
    new_tokens = 64
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )[0, len(prompt) :].tolist()
    runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=64, threads=2)
    logits = runner.forward(0, 0, prompt)
    ours = []
    for _ in range(new_tokens):
        ours.append(int(np.argmax(logits)))
        logits = runner.forward(0, len(prompt) + len(ours) - 1, [ours[-1]])
    assert ours == ref


def test_bad_requests_raise_clear_errors(case):
    _, _, artifact = case
    runner = _core.ModelRunner(str(artifact), max_lanes=1, max_batch_tokens=16, threads=1)
    with pytest.raises(IndexError, match="lane 1"):
        runner.forward(1, 0, [1])
    with pytest.raises(ValueError, match="gap"):
        runner.forward(0, 5, [1])
    with pytest.raises(ValueError, match="max_batch_tokens"):
        runner.forward(0, 0, list(range(17)))
    with pytest.raises(IndexError, match="vocabulary"):
        runner.forward(0, 0, [VOCAB])


def _decoded(artifact: _core.Artifact, name: str) -> np.ndarray:
    info = artifact.tensor_info(name)
    raw = artifact.tensor(name)
    if info["dtype"] == "bf16":
        return bf16_bits_to_f32(raw)
    if info["dtype"] == "q8_0":
        return dequantize_q8_0(raw, info["shape"])
    return np.asarray(raw, dtype=np.float32)


def _quantize_activation_blocks(x: torch.Tensor) -> torch.Tensor:
    """What the q8_0 matmul does to its input: int8 per 32 values, scale max|x|/127."""
    blocks = x.reshape(-1, 32)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inverse) * (amax / 127.0)).reshape(x.shape)


@pytest.mark.parametrize("dtype", ["bf16", "q8_0"])
def test_compressed_weights_match_transformers_on_decoded_weights(case, dtype, tmp_path):
    """bf16 and q8_0 artifacts against HF running the very weights the artifact stores.

    For q8_0 the reference also rounds every Linear input to int8 blocks as our kernel does,
    which makes the comparison tight again (the int8 rounding alone is ~2.5% RMS on these
    random models); a loose bound against plain HF checks the size of that rounding.
    """
    name, model, artifact = case
    path = convert_source(
        artifact.parent / "hf", tmp_path / f"{dtype}.ninfer", dtype=dtype, progress=False
    )
    stored = _core.Artifact.open(str(path))
    assert stored.tensor_info("model.layers.0.mlp.down_proj.weight")["dtype"] == dtype
    reference = type(model)(model.config).eval()
    state = {n: torch.from_numpy(_decoded(stored, n).copy()) for n in stored.tensor_names()}
    reference.load_state_dict(state, strict=False)
    if model.config.tie_word_embeddings:
        reference.tie_weights()
    ids = _tokens(4, 80)
    ours = _core.ModelRunner(str(path), threads=2).forward(0, 0, ids, all_logits=True)
    if dtype == "bf16":
        _assert_close(ours, _hf_logits(reference, ids), f"{name} bf16")
        return
    plain = _hf_logits(reference, ids)
    hooks = [
        m.register_forward_pre_hook(lambda _, args: (_quantize_activation_blocks(args[0]),))
        for m in reference.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    emulated = _hf_logits(reference, ids)
    for hook in hooks:
        hook.remove()

    # An input sitting on a rounding boundary may round the other way here than in torch,
    # which moves that one position's logits; every other position must match tightly.
    per_position = np.abs(ours - emulated).max(axis=1)
    exact = per_position <= 2e-5 * np.abs(emulated).max()
    assert exact.mean() >= 0.85, f"{name} q8_0: only {exact.mean():.0%} of positions match"

    def relative_rms(ref: np.ndarray) -> float:
        return float(np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref**2)))

    assert relative_rms(plain) < 0.05, f"{name} q8_0: error against float activations too large"
