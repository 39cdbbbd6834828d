#!/usr/bin/env bash
# On the GPU machine: build (tools/gpu/build.sh), run the quantized-KV GPU tests (plus
# NINFER_KV_EXTRA_TESTS, e.g. tests/test_cuda_prefill_attention.py), then the --kv-dtype decode benchmark (bench/bench_cuda_kv.py);
# logs and results land in OUT_DIR.   usage: tools/gpu/kv_check.sh OUT_DIR
#   NINFER_KV_TESTS_TIMEOUT / NINFER_KV_BENCH_TIMEOUT: seconds for each part (default 35 / 55).
set -uo pipefail
out=${1:?usage: tools/gpu/kv_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$out/machine.txt" 2>&1
# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
build_extension "$out/build.log" || exit 1
echo "== quantized-KV GPU tests"
timeout "${NINFER_KV_TESTS_TIMEOUT:-35}" python3 -m pytest -m gpu tests/test_cuda_kv_dtype.py \
  ${NINFER_KV_EXTRA_TESTS:-} -q -rs -p no:cacheprovider -o addopts="" 2>&1 |
  tee "$out/tests_kv.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== benchmark"
timeout "${NINFER_KV_BENCH_TIMEOUT:-55}" python3 bench/bench_cuda_kv.py --out "$out" ${NINFER_KV_BENCH_ARGS:-} 2>&1 |
  tee "$out/bench_kv.log" | tail -45
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
