#!/usr/bin/env bash
# On the GPU machine: build (tools/gpu/build.sh), run the FP8/NVFP4 GPU tests, the quantized
# benchmark (bench/bench_cuda_quant.py), then the bf16 model and graph GPU tests as a
# regression check; logs and results land in OUT_DIR.   usage: tools/gpu/quant_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/quant_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$out/machine.txt" 2>&1
echo "== build"
if ! tools/gpu/build.sh "$out/build.log"; then
  tail -60 "$out/build.log"
  exit 1
fi
grep "build rc" "$out/build.log"
grep -iE "warning" "$out/build.log" | head -20
# shellcheck disable=SC1091
source build/gpu/env.sh
echo "== quantized-weight GPU tests"
timeout 240 python3 -m pytest -m gpu tests/test_cuda_quant_gemv.py -q -rs -p no:cacheprovider -o addopts="" \
  -x 2>&1 | tee "$out/tests_quant.log" | tail -30
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== benchmark"
timeout "${NINFER_QUANT_BENCH_TIMEOUT:-330}" python3 bench/bench_cuda_quant.py --out "$out" ${NINFER_QUANT_BENCH_ARGS:-} 2>&1 |
  tee "$out/bench_quant.log" | grep -vE "^- " | tail -70
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "${NINFER_QUANT_REGRESSION-1}" = 1 ]; then
  echo "== bf16 GPU regression tests"
  timeout "${NINFER_QUANT_REGRESSION_TIMEOUT:-120}" python3 -m pytest -m gpu tests/test_cuda_model.py tests/test_cuda_graphs.py \
    tests/test_cuda_gemv.py -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests_regression.log" | tail -8
fi
exit "$status"
