#!/usr/bin/env bash
# On the GPU machine: build (tools/gpu/build.sh), the FP8 prefill GEMM tests, the prefill
# benchmark (bench/bench_cuda_fp8_prefill.py), then the model-level prefill tests; logs and
# results land in OUT_DIR.   usage: tools/gpu/fp8_prefill.sh OUT_DIR
#   FP8_BENCH_BUDGET_S (default 60): the benchmark starts no model run past this many seconds;
#   FP8_MODEL_TESTS=0 skips the model-level tests.
set -uo pipefail
out=${1:?usage: tools/gpu/fp8_prefill.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
build_extension "$out/build.log" || exit 1
grep -iE "warning" "$out/build.log" | head -20

echo "== FP8 GEMM tests"
timeout 60 "$py" -m pytest -m gpu tests/test_cuda_fp8_gemm.py -q -rs -p no:cacheprovider -o addopts="" \
  -k "not quantized_model" 2>&1 | tee "$out/tests_gemm.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark"
timeout 300 "$py" bench/bench_cuda_fp8_prefill.py --out "$out" --budget-s "${FP8_BENCH_BUDGET_S:-60}" 2>&1 |
  tee "$out/bench.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "${FP8_MODEL_TESTS:-1}" = 1 ]; then
  echo "== model-level prefill tests"
  timeout 90 "$py" -m pytest -m gpu tests/test_cuda_fp8_gemm.py tests/test_cuda_quant_gemv.py -q -rs -s \
    -p no:cacheprovider -o addopts="" -k "quantized_model and (prefill or eager])" 2>&1 |
    tee "$out/tests_model.log" | grep -E "rms|passed|failed|Error|assert" | tail -20
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit "$status"
