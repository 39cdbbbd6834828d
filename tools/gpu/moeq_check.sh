#!/usr/bin/env bash
# On the GPU machine: build, the fused decode MoE and GDN kernel tests, the Qwen3.6-35B-A3B
# benchmark in bf16 / fp8 / nvfp4 (bench/bench_cuda_moe_quant.py), graph replays against eager
# steps, then the model-level MoE GPU tests (tiny quantized MoE hybrids against the CPU, the
# bf16 MoE model against transformers). Logs and results land in OUT_DIR.
#   usage: tools/gpu/moeq_check.sh OUT_DIR
#   NINFER_MOEQ_BENCH_ARGS: extra benchmark arguments (e.g. "--dtypes fp8 --contexts 1024").
#   NINFER_MOEQ_MODEL_TESTS=0: stop after the graph tests (a short device call).
set -uo pipefail
out=${1:?usage: tools/gpu/moeq_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$out/machine.txt" 2>&1
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
build_extension "$out/build.log" || exit 1
grep -iE "warning" "$out/build.log" | head -20
# One timeout per step so the benchmark always gets its turn.
pytest_gpu() {
  local limit=$1
  shift
  timeout "$limit" "$py" -m pytest -m gpu -q -rs -p no:cacheprovider -o addopts="" "$@"
}

echo "== fused MoE kernel tests, GDN kernels (decode form: conv + state, prepared delta rule)"
# (the chunked delta rule's long-lane tests are check.sh's)
pytest_gpu "${NINFER_MOEQ_KERNEL_TIMEOUT:-60}" tests/test_cuda_moe_decode.py tests/test_cuda_hybrid_ops.py \
  -k "not hybrid_on_the_gpu and not chunked" 2>&1 | tee "$out/tests_kernels.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark"
# shellcheck disable=SC2086  # NINFER_MOEQ_BENCH_ARGS is a word list
timeout "${NINFER_MOEQ_BENCH_TIMEOUT:-150}" "$py" bench/bench_cuda_moe_quant.py --out "$out" \
  ${NINFER_MOEQ_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" | grep -vE "^- "
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== graph replays == eager steps (hybrid and MoE hybrid)"
pytest_gpu "${NINFER_MOEQ_GRAPH_TIMEOUT:-60}" tests/test_cuda_graphs.py -k qwen3_5 2>&1 |
  tee "$out/tests_graphs.log" | tail -8
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

[ "${NINFER_MOEQ_MODEL_TESTS:-1}" = 0 ] && exit "$status"
echo "== model tests"
pytest_gpu "${NINFER_MOEQ_MODEL_TIMEOUT:-90}" -s tests/test_cuda_moe_decode.py -k hybrid 2>&1 |
  tee "$out/tests_model.log" | grep -E "GPU - CPU|passed|failed|Error|assert" | tail -20
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
pytest_gpu "${NINFER_MOEQ_MODEL_TIMEOUT:-90}" tests/test_cuda_moe.py tests/test_cuda_graphs.py \
  tests/test_cuda_hybrid_model.py 2>&1 | tee "$out/tests_regression.log" | tail -12
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
