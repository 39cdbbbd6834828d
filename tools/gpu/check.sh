#!/usr/bin/env bash
# On the GPU machine: build the extension with the CUDA backend on all cores (sm_90a), run
# the GPU tests, run the benchmark, and leave logs plus a results table in OUT_DIR.
#   usage: tools/gpu/check.sh OUT_DIR [--small]   (--small: a small benchmark shape)
#   NINFER_BENCH=dense|hybrid|all (default all): which benchmarks run (bench_cuda.py: the dense
#   stand-in; bench_cuda_hybrid.py: the real Qwen3.6 27B / 35B-A3B hybrid shapes).
set -uo pipefail
out=${1:?usage: tools/gpu/check.sh OUT_DIR [--small]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0

{ nvidia-smi; nvcc --version; } >"$out/machine.txt" 2>&1

# Packages the GPU image lacks (granian, msgspec for the server tests) travel as wheels in .whl/,
# and so does xgrammar's source archive (xgrammar-0.2.9.tar.gz), which the build takes from there.
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels

echo "== build"
if ! tools/gpu/build.sh "$out/build.log"; then
  tail -60 "$out/build.log"
  exit 1
fi
grep "build rc" "$out/build.log"
grep -iE "warning" "$out/build.log" | head -20
echo "== loads above a grid-dependency wait (tools/pdl_sass_audit.py)"
PATH="$PATH:/usr/local/cuda/bin" "$py" tools/pdl_sass_audit.py build/gpu/CMakeFiles/ninfer_cuda.dir/native/backends/cuda/*.cu.o \
  >"$out/pdl_audit.txt" 2>&1 || true
grep -v "before the wait" "$out/pdl_audit.txt" | sed 's/(.*//' | sort | uniq -c | sort -rn | head -12
# shellcheck disable=SC1091
source build/gpu/env.sh

echo "== GPU tests"
# Every gpu-marked test: the CUDA op/model files, the prefix cache and speculative rounds on
# CUDA, and the server over a CUDA engine.
"$py" -m pytest -m gpu tests/test_cuda_*.py tests/test_prefix_cache_cuda.py tests/test_speculative_cuda.py \
  tests/test_server_hybrid_engine.py tests/test_server_prefix_cache.py -q -rs -s -p no:cacheprovider \
  -o addopts="" 2>&1 | tee "$out/tests.log" | grep -vE "^$" | tail -60
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

bench=${NINFER_BENCH:-all}
if [ "$bench" = all ] || [ "$bench" = dense ]; then
  echo "== benchmark (dense stand-in)"
  "$py" bench/bench_cuda.py --out "$out" "$@" 2>&1 | tee "$out/bench.log" | tail -45
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$bench" = all ] || [ "$bench" = hybrid ]; then
  echo "== benchmark (hybrid shapes)"
  # shellcheck disable=SC2086  # NINFER_HYBRID_ARGS: e.g. "--shapes qwen3.6-27b --decode-only"
  "$py" bench/bench_cuda_hybrid.py --out "$out" ${NINFER_HYBRID_ARGS:-} 2>&1 | tee "$out/bench_hybrid.log" | grep -v "^\[" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit "$status"
