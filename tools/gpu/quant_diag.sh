#!/usr/bin/env bash
# On the GPU machine: build, run the quantized-kernel GPU tests, the graph-vs-eager diagnostics
# of a quantized hybrid (tools/gpu/quant_graph_diag.py), the CPU runner on a quantized artifact
# under cuda-gdb (a host crash there then prints its backtrace), and the quantized GEMV
# benchmark.   usage: tools/gpu/quant_diag.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/quant_diag.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "== build"
if ! tools/gpu/build.sh "$out/build.log"; then
  tail -60 "$out/build.log"
  exit 1
fi
grep "build rc" "$out/build.log"
grep -iE "warning" "$out/build.log" | head -10
# shellcheck disable=SC1091
source build/gpu/env.sh
log=$out/diag.log
if [ "${NINFER_QUANT_KERNEL_TESTS-1}" = 1 ]; then
  echo "== kernel tests" | tee -a "$log"
  timeout 150 python3 -m pytest -m gpu tests/test_cuda_quant_gemv.py -q -p no:cacheprovider -o addopts="" \
    -k "not test_quantized_model_on_the_gpu" 2>&1 | grep -vE "^$|^\.+" | tail -25 | tee -a "$log"
fi
echo "== graphs against eager, quantized hybrid" | tee -a "$log"
for dtype in fp8 nvfp4; do
  timeout 60 python3 tools/gpu/quant_graph_diag.py $dtype 2>&1 | grep -vE "^\s+File|^$" | tail -8 | tee -a "$log"
done
if [ "${NINFER_QUANT_CPU_GDB-1}" = 1 ]; then
  echo "== CPU runner on a quantized artifact (cuda-gdb)" | tee -a "$log"
  timeout 120 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt -ex "info registers rip" \
    --args python3 tools/gpu/quant_graph_diag.py fp8 cpu >"$out/gdb.log" 2>&1
  echo "rc=$?" | tee -a "$log"
  grep -E "^#|signal|CPU|rip|artifact" "$out/gdb.log" | head -40 | tee -a "$log"
fi
echo "== GEMV benchmark" | tee -a "$log"
timeout "${NINFER_QUANT_BENCH_TIMEOUT:-120}" python3 bench/bench_cuda_quant.py --out "$out" --dtypes fp8,nvfp4 \
  --gemv-only 2>&1 | grep -E "^gemv|ceilings" | tee -a "$log"
