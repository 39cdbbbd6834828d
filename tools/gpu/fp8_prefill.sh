#!/usr/bin/env bash
# On the GPU machine: build (tools/gpu/build.sh), the FP8 prefill tests (GEMM and quantizer
# against float64, the quantized models' prefill against the CPU), then the prefill benchmark
# (bench/bench_cuda_fp8_prefill.py); logs and results land in OUT_DIR.
#   usage: tools/gpu/fp8_prefill.sh OUT_DIR [SECONDS]
# SECONDS (default 600): the whole script's time; the benchmark starts no model run past the
# point where about 12 s would be left.
set -uo pipefail
out=${1:?usage: tools/gpu/fp8_prefill.sh OUT_DIR [SECONDS]}
deadline=$(( $(date +%s) + ${2:-600} ))
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
export CUBLASLT_LOG_LEVEL=${CUBLASLT_LOG_LEVEL:-1}  # cuBLASLt's own error messages (why a heuristic refused)
py=${PYTHON:-python3}
status=0
left() { echo $(( deadline - $(date +%s) )); }
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
build_extension "$out/build.log" || exit 1
grep -iE "warning" "$out/build.log" | head -20

echo "== FP8 prefill tests ($(left) s left)"
timeout 60 "$py" -m pytest -m gpu tests/test_cuda_fp8_gemm.py tests/test_cuda_quant_gemv.py -q -rs -s \
  -p no:cacheprovider -o addopts="" -k "test_cuda_fp8_gemm or (quantized_model and eager)" 2>&1 |
  tee "$out/tests.log" | grep -E "rms|nvfp4 via|passed|failed|Error|assert|^E " | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark ($(left) s left)"
budget=$(( $(left) - 12 ))
timeout $(( $(left) > 5 ? $(left) - 2 : 3 )) "$py" bench/bench_cuda_fp8_prefill.py --out "$out" \
  --budget-s "$(( budget > 0 ? budget : 0 ))" 2>&1 | tee "$out/bench.log" | tail -45
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
