#!/usr/bin/env bash
# On the GPU machine, one call for the FP8 prefill GEMM: build, the scale-layout probe
# (tools/gpu/fp8_scale_probe.py: where cuBLASLt reads the block scales, and the GEMM against
# float64), the FP8 GEMM and quantized-model tests, the 27B prefill benchmark, then a kernel
# profile of one 27B FP8 prefill (tools/gpu/prefill_profile.py).
#   usage: tools/gpu/fp8_probe.sh OUT_DIR [SECONDS]
set -uo pipefail
out=${1:?usage: tools/gpu/fp8_probe.sh OUT_DIR [SECONDS]}
deadline=$(( $(date +%s) + ${2:-300} ))
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
left() { echo $(( deadline - $(date +%s) )); }
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
build_extension "$out/build.log" || exit 1
grep -iE "warning" "$out/build.log" | head -20

echo "== scale probe ($(left) s left)"
timeout 40 "$py" tools/gpu/fp8_scale_probe.py "$out" 2>&1 | tee "$out/probe.log" | tail -30
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== tests ($(left) s left)"
timeout 60 "$py" -m pytest -m gpu tests/test_cuda_fp8_gemm.py tests/test_cuda_moe_decode.py \
  tests/test_cuda_quant_gemv.py -q -rs -s -p no:cacheprovider -o addopts="" \
  -k "test_cuda_fp8_gemm or quantized_moe_hybrid or modelopt_mixed or (quantized_model and eager)" 2>&1 |
  tee "$out/tests.log" | grep -E "rms|nvfp4 via|passed|failed|Error|assert|^E " | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark ($(left) s left)"
budget=$(( $(left) - 30 ))
timeout $(( $(left) > 10 ? $(left) - 5 : 5 )) "$py" bench/bench_cuda_fp8_prefill.py --out "$out" \
  --shapes qwen3.6-27b --budget-s "$(( budget > 0 ? budget : 0 ))" 2>&1 | tee "$out/bench.log" | tail -30
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "$(left)" -gt 25 ]; then
  echo "== profile ($(left) s left)"
  timeout $(( $(left) - 3 )) "$py" tools/gpu/prefill_profile.py --out "$out" 2>&1 | tee "$out/profile.log" | tail -40
fi
exit "$status"
