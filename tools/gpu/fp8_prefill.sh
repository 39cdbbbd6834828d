#!/usr/bin/env bash
# On the GPU machine: build (tools/gpu/build.sh), the FP8 prefill tests (GEMM and quantizer
# against float64, the quantized models' prefill against the CPU), then the prefill benchmark
# (bench/bench_cuda_fp8_prefill.py); logs and results land in OUT_DIR.
#   usage: tools/gpu/fp8_prefill.sh OUT_DIR [SECONDS]
# SECONDS (default 600): the whole script's time; the benchmark starts no model run past the
# point where about 12 s would be left.
#   PROBE=1: first the scale-layout probe (tools/gpu/fp8_scale_probe.py: where cuBLASLt reads
#   the block scales, and the GEMM against float64), and last a kernel profile of one 27B FP8
#   prefill (tools/gpu/prefill_profile.py) if 25 s are left.
#   PROFILE=1: the kernel profile alone (default: as PROBE).
#   SHAPES="qwen3.6-27b": the benchmark's shapes (default: its own list).
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

if [ "${PROBE:-0}" = 1 ]; then
  echo "== scale probe ($(left) s left)"
  timeout 40 "$py" tools/gpu/fp8_scale_probe.py "$out" 2>&1 | tee "$out/probe.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo "== FP8 prefill tests ($(left) s left)"
timeout 150 "$py" -m pytest -m gpu tests/test_cuda_fp8_gemm.py tests/test_cuda_moe_decode.py tests/test_cuda_quant_gemv.py \
  -q -rs -s -p no:cacheprovider -o addopts="" \
  -k "test_cuda_fp8_gemm or quantized_moe_hybrid or modelopt_mixed or (quantized_model and eager)" 2>&1 |
  tee "$out/tests.log" | grep -E "rms|nvfp4 via|passed|failed|Error|assert|^E " | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark ($(left) s left)"
budget=$(( $(left) - 12 ))
# shellcheck disable=SC2046  # the --shapes words
timeout $(( $(left) > 5 ? $(left) - 2 : 3 )) "$py" bench/bench_cuda_fp8_prefill.py --out "$out" \
  $([ -n "${SHAPES:-}" ] && echo --shapes "$SHAPES") --budget-s "$(( budget > 0 ? budget : 0 ))" 2>&1 |
  tee "$out/bench.log" | tail -45
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "${PROFILE:-${PROBE:-0}}" = 1 ] && [ "$(left)" -gt 25 ]; then
  echo "== profile ($(left) s left)"
  timeout $(( $(left) - 3 )) "$py" tools/gpu/prefill_profile.py --out "$out" 2>&1 | tee "$out/profile.log" | tail -40
fi
exit "$status"
