"""Write a random-valued GGUF of a Qwen3.5/3.6 hybrid decoder shape (llama.cpp's `qwen35`
architecture, or `qwen35moe` for the mixture-of-experts shapes) in Q8_0 or Q4_K_M, for
llama-bench on the same shape as NInfer's benchmarks.

    python bench/gguf_random_qwen35.py --preset qwen3.6-27b --ftype q8_0 -o 27b-q8_0.gguf
    python bench/gguf_random_qwen35.py --preset qwen3.6-35b-a3b --ftype q4_k_m -o 35b.gguf
    python bench/gguf_random_qwen35.py --preset tiny --ftype q4_k_m -o tiny.gguf   # tests
    python bench/gguf_random_qwen35.py --preset tiny-moe --ftype q8_0 -o tiny-moe.gguf

The layout is what llama.cpp's own converter writes for Qwen3_5ForConditionalGeneration
(conversion/qwen.py): full-attention layers every `full_attention_interval` with the gated
query (attn_q holds query and gate, 2 x heads x head_dim rows), attn_k, attn_v, q/k norms; the
other layers are gated delta-net layers (fused attn_qkv, attn_gate = z, ssm_conv1d, ssm_a,
ssm_dt bias, ssm_alpha, ssm_beta, ssm_norm, ssm_out); every layer has the dense SwiGLU FFN, or,
in qwen35moe, the router (ffn_gate_inp), the stacked experts (ffn_gate_exps, ffn_up_exps,
ffn_down_exps: the converter splits HF's fused gate_up) and the sigmoid-gated shared expert
(ffn_gate_inp_shexp, ffn_{gate,up,down}_shexp).
The tokenizer is llama.cpp's "none" vocabulary with `qwen35.vocab_size` dummy tokens:
llama-bench draws random token ids and needs nothing else.

Types follow llama-quantize for this architecture (src/llama-quant.cpp of the pinned source):
- q8_0: every 2-D weight Q8_0, token_embd and output included.
- q4_k_m: Q4_K by default; output Q6_K; attn_v and the delta-net attn_qkv (both "attn_v-like")
  and ffn_down (the experts' and the shared expert's too) Q6_K where llama.cpp's use_more_bits
  picks them (first and last eighth of the layers and every third in between), else Q4_K.
Norms, ssm_conv1d, ssm_a, ssm_dt and the shared expert's gate vector stay F32, as
llama-quantize leaves them; the router (ffn_gate_inp, never quantized) stays in the
converter's F16.

Block bytes are drawn at random once per type (one template of a few MiB, finite fp16 block
scales of the size a quantizer would give N(0, 0.02) weights) and repeated through every
tensor of that type: the speed of a memory-bound decode does not depend on the values, and the
file is written in one pass with parallel positional writes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

ARCH = "qwen35"
ARCH_MOE = "qwen35moe"
Q = GGMLQuantizationType
FTYPES = {"q8_0": 7, "q4_k_m": 15}  # llama_ftype: MOSTLY_Q8_0, MOSTLY_Q4_K_M
TEMPLATE_BLOCKS = 1 << 16  # per type: 2.2 MiB of Q8_0 blocks, 9 MiB of Q4_K
WRITE_CHUNK = 64 << 20
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_k_heads: int
    linear_v_heads: int
    linear_head_dim: int
    conv_kernel: int
    full_attention_interval: int
    vocab: int
    rope_dim: int
    rope_sections: tuple[int, int, int, int]
    rope_theta: float
    rms_eps: float
    experts: int = 0  # > 0: qwen35moe
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0

    @property
    def arch(self) -> str:
        return ARCH_MOE if self.experts else ARCH


def _ninfer_preset(name: str) -> dict:
    """The preset's text_config from NInfer's own table (one source of truth for the shapes);
    loaded from its file so the script runs without the native extension."""
    path = REPO / "python" / "ninfer" / "convert" / "qwen3_5_presets.py"
    spec = importlib.util.spec_from_file_location("qwen3_5_presets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.qwen3_5_preset(name)["text_config"]


def preset_shape(name: str) -> Shape:
    if name == "tiny":
        return Shape(512, 1024, 4, 4, 1, 128, 2, 4, 64, 4, 4, 4096, 32, (11, 11, 10, 0), 1e7, 1e-6)
    if name == "tiny-moe":
        return Shape(
            *(512, 0, 4, 4, 1, 128, 2, 4, 64, 4, 4, 4096, 32, (11, 11, 10, 0), 1e7, 1e-6),
            experts=8,
            experts_used=2,
            expert_ffn=256,
            shared_ffn=256,
        )
    text = _ninfer_preset(name)
    rope = text["rope_parameters"]
    sections = tuple(rope["mrope_section"]) + (0,)
    return Shape(
        hidden=text["hidden_size"],
        ffn=text.get("intermediate_size", 0),
        experts=text.get("num_experts", 0),
        experts_used=text.get("num_experts_per_tok", 0),
        expert_ffn=text.get("moe_intermediate_size", 0),
        shared_ffn=text.get("shared_expert_intermediate_size", 0),
        layers=text["num_hidden_layers"],
        heads=text["num_attention_heads"],
        kv_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"],
        linear_k_heads=text["linear_num_key_heads"],
        linear_v_heads=text["linear_num_value_heads"],
        linear_head_dim=text["linear_key_head_dim"],
        conv_kernel=text["linear_conv_kernel_dim"],
        full_attention_interval=text["full_attention_interval"],
        vocab=text["vocab_size"],
        rope_dim=int(text["head_dim"] * rope["partial_rotary_factor"]),
        rope_sections=sections,
        rope_theta=float(rope["rope_theta"]),
        rms_eps=float(text["rms_norm_eps"]),
    )


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quantize's choice of the layers that get more bits (Q4_K_M: Q6_K)."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def is_full_attention(shape: Shape, layer: int) -> bool:
    return (layer + 1) % shape.full_attention_interval == 0


def tensor_plan(shape: Shape, ftype: str) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, ne as llama.cpp orders it: row length first, type) for every tensor, in file order."""
    dense = Q.Q8_0 if ftype == "q8_0" else Q.Q4_K

    def heavy(i_layer: int) -> Q:  # attn_v-like tensors and ffn_down under Q4_K_M
        return Q.Q6_K if ftype == "q4_k_m" and use_more_bits(i_layer, shape.layers) else dense

    h, f32 = shape.hidden, Q.F32
    key_dim = shape.linear_k_heads * shape.linear_head_dim
    value_dim = shape.linear_v_heads * shape.linear_head_dim
    q_rows = shape.heads * shape.head_dim
    kv_rows = shape.kv_heads * shape.head_dim
    plan: list[tuple[str, tuple[int, ...], Q]] = [("token_embd.weight", (h, shape.vocab), dense)]
    for i in range(shape.layers):
        b = f"blk.{i}"
        plan.append((f"{b}.attn_norm.weight", (h,), f32))
        if is_full_attention(shape, i):
            plan += [
                (f"{b}.attn_q.weight", (h, 2 * q_rows), dense),  # query and its output gate
                (f"{b}.attn_k.weight", (h, kv_rows), dense),
                (f"{b}.attn_v.weight", (h, kv_rows), heavy(i)),
                (f"{b}.attn_output.weight", (q_rows, h), dense),
                (f"{b}.attn_q_norm.weight", (shape.head_dim,), f32),
                (f"{b}.attn_k_norm.weight", (shape.head_dim,), f32),
            ]
        else:
            plan += [
                (f"{b}.attn_qkv.weight", (h, 2 * key_dim + value_dim), heavy(i)),
                (f"{b}.attn_gate.weight", (h, value_dim), dense),
                (f"{b}.ssm_conv1d.weight", (shape.conv_kernel, 2 * key_dim + value_dim), f32),
                (f"{b}.ssm_dt.bias", (shape.linear_v_heads,), f32),
                (f"{b}.ssm_a", (shape.linear_v_heads,), f32),
                (f"{b}.ssm_beta.weight", (h, shape.linear_v_heads), dense),
                (f"{b}.ssm_alpha.weight", (h, shape.linear_v_heads), dense),
                (f"{b}.ssm_norm.weight", (shape.linear_head_dim,), f32),
                (f"{b}.ssm_out.weight", (value_dim, h), dense),
            ]
        plan.append((f"{b}.post_attention_norm.weight", (h,), f32))
        if shape.experts:
            e, fe, fs = shape.experts, shape.expert_ffn, shape.shared_ffn
            plan += [
                (f"{b}.ffn_gate_inp.weight", (h, e), Q.F16),
                (f"{b}.ffn_gate_exps.weight", (h, fe, e), dense),
                (f"{b}.ffn_up_exps.weight", (h, fe, e), dense),
                (f"{b}.ffn_down_exps.weight", (fe, h, e), heavy(i)),
                (f"{b}.ffn_gate_inp_shexp.weight", (h,), f32),
                (f"{b}.ffn_gate_shexp.weight", (h, fs), dense),
                (f"{b}.ffn_up_shexp.weight", (h, fs), dense),
                (f"{b}.ffn_down_shexp.weight", (fs, h), heavy(i)),
            ]
        else:
            plan += [
                (f"{b}.ffn_gate.weight", (h, shape.ffn), dense),
                (f"{b}.ffn_up.weight", (h, shape.ffn), dense),
                (f"{b}.ffn_down.weight", (shape.ffn, h), heavy(i)),
            ]
    output = Q.Q6_K if ftype == "q4_k_m" else Q.Q8_0
    plan += [("output_norm.weight", (h,), f32), ("output.weight", (h, shape.vocab), output)]
    return plan


def nbytes(ne: tuple[int, ...], kind: Q) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    if ne[0] % block:
        raise ValueError(f"rows of {ne[0]} are not whole {kind.name} blocks of {block}")
    return int(np.prod(ne)) // block * size


def _fp16_bytes(rng: np.random.Generator, n: int, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def block_template(kind: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `kind` whose fp16 scales are finite and of a quantizer's size."""
    _, size = GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, (TEMPLATE_BLOCKS, size), dtype=np.uint8)
    if kind == Q.Q8_0:  # d, qs[32]: |w| <= 127 d
        blocks[:, 0:2] = _fp16_bytes(rng, TEMPLATE_BLOCKS, 2e-4, 6e-4)
    elif kind in (Q.Q4_K, Q.Q5_K):  # d, dmin, 6-bit scales and mins, quants
        blocks[:, 0:2] = _fp16_bytes(rng, TEMPLATE_BLOCKS, 5e-5, 1.5e-4)
        blocks[:, 2:4] = _fp16_bytes(rng, TEMPLATE_BLOCKS, 5e-5, 1.5e-4)
    elif kind == Q.Q6_K:  # ql, qh, int8 scales, then d last
        blocks[:, size - 2 : size] = _fp16_bytes(rng, TEMPLATE_BLOCKS, 2e-5, 6e-5)
    else:
        raise ValueError(f"no template for {kind.name}")
    return blocks.reshape(-1)


def f32_values(name: str, count: int, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("ssm_a"):  # -exp(A_log): negative decay rates
        return -rng.uniform(0.5, 8.0, count).astype(np.float32)
    if name.endswith("norm.weight"):
        return rng.uniform(0.9, 1.1, count).astype(np.float32)
    if "gate_inp" in name:  # router and shared-expert gate: small logits
        return rng.normal(0.0, 0.02, count).astype(np.float32)
    return rng.normal(0.0, 0.1, count).astype(np.float32)


def add_metadata(writer: GGUFWriter, shape: Shape, ftype: str, name: str) -> None:
    key_dim_v = shape.linear_v_heads * shape.linear_head_dim
    writer.add_string("general.name", f"random {name} {ftype}")
    writer.add_uint32("general.file_type", FTYPES[ftype])
    writer.add_uint32("general.quantization_version", 2)
    p = shape.arch
    moe = {
        "expert_count": shape.experts,
        "expert_used_count": shape.experts_used,
        "expert_feed_forward_length": shape.expert_ffn,
        "expert_shared_feed_forward_length": shape.shared_ffn,
    }
    for key, value in {
        "vocab_size": shape.vocab,
        "context_length": 262144,
        "embedding_length": shape.hidden,
        "block_count": shape.layers,
        "feed_forward_length": shape.ffn,
        "attention.head_count": shape.heads,
        "attention.head_count_kv": shape.kv_heads,
        "attention.key_length": shape.head_dim,
        "attention.value_length": shape.head_dim,
        "rope.dimension_count": shape.rope_dim,
        "ssm.conv_kernel": shape.conv_kernel,
        "ssm.state_size": shape.linear_head_dim,
        "ssm.group_count": shape.linear_k_heads,
        "ssm.time_step_rank": shape.linear_v_heads,
        "ssm.inner_size": key_dim_v,
        "full_attention_interval": shape.full_attention_interval,
        **(moe if shape.experts else {}),
    }.items():
        if value or key != "feed_forward_length":  # MoE shapes may have no dense FFN width
            writer.add_uint32(f"{p}.{key}", value)
    writer.add_float32(f"{p}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    writer.add_float32(f"{p}.rope.freq_base", shape.rope_theta)
    writer.add_array(f"{p}.rope.dimension_sections", list(shape.rope_sections))
    writer.add_string("tokenizer.ggml.model", "none")


def write_gguf(
    path: Path, shape: Shape, ftype: str, name: str, seed: int = 0, threads: int = 8
) -> int:
    """Write the file; returns its size in bytes."""
    rng = np.random.default_rng(seed)
    plan = tensor_plan(shape, ftype)
    writer = GGUFWriter(path, shape.arch)
    add_metadata(writer, shape, ftype, name)
    for tensor_name, ne, kind in plan:
        writer.add_tensor_info(
            tensor_name, ne[::-1], np.dtype(np.float32), nbytes(ne, kind), raw_dtype=kind
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    fout.flush()
    align = writer.data_alignment
    offset = GGUFWriter.ggml_pad(fout.tell(), align)
    quantized = {k for _, _, k in plan if k not in (Q.F32, Q.F16)}
    templates = {kind: block_template(kind, rng) for kind in quantized}
    jobs: list[tuple[int, memoryview]] = []
    small: list[tuple[int, bytes]] = []
    for tensor_name, ne, kind in plan:
        size = nbytes(ne, kind)
        if kind == Q.F32:
            small.append((offset, f32_values(tensor_name, size // 4, rng).tobytes()))
        elif kind == Q.F16:
            small.append(
                (offset, f32_values(tensor_name, size // 2, rng).astype(np.float16).tobytes())
            )
        else:
            template = memoryview(templates[kind])
            step = len(template) // GGML_QUANT_SIZES[kind][1] * GGML_QUANT_SIZES[kind][1]
            step = min(step, WRITE_CHUNK)
            for start in range(0, size, step):
                jobs.append((offset + start, template[: min(step, size - start)]))
        offset += GGUFWriter.ggml_pad(size, align)
    fd = fout.fileno()
    os.ftruncate(fd, offset)
    for at, data in small:
        os.pwrite(fd, data, at)

    def put(job: tuple[int, memoryview]) -> None:
        at, data = job
        while data:
            done = os.pwrite(fd, data, at)
            at, data = at + done, data[done:]

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, jobs))
    writer.close()
    return offset


def weight_bytes_per_token(shape: Shape, ftype: str) -> int:
    """Bytes a one-token decode step reads from weights: every tensor but the embedding table
    (one row), of the expert stacks only the experts_used of experts a token is routed to."""
    total = 0
    for name, ne, kind in tensor_plan(shape, ftype):
        if name == "token_embd.weight":
            continue
        size = nbytes(ne, kind)
        total += size * shape.experts_used // shape.experts if "_exps." in name else size
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.6-27b", help="NInfer preset name, or 'tiny'")
    parser.add_argument("--ftype", choices=sorted(FTYPES), required=True)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (a multiple of 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=8, help="parallel writers")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    shape = preset_shape(args.preset)
    if args.layers is not None:
        if args.layers <= 0 or args.layers % shape.full_attention_interval:
            parser.error(f"--layers must be a positive multiple of {shape.full_attention_interval}")
        shape = Shape(**{**shape.__dict__, "layers": args.layers})
    start = time.perf_counter()
    size = write_gguf(args.output, shape, args.ftype, args.preset, args.seed, args.threads)
    seconds = time.perf_counter() - start
    print(
        f"{args.output}: {size / 1e9:.2f} GB in {seconds:.1f} s ({size / 1e9 / seconds:.2f} GB/s); "
        f"{args.preset} x {shape.layers} layers {args.ftype}; weight bytes per decode token "
        f"{weight_bytes_per_token(shape, args.ftype) / 1e9:.3f} GB",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
