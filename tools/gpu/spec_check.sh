#!/usr/bin/env bash
# On the GPU machine (issue 15): build, run the gpu-marked speculative tests (greedy equality on
# CUDA, verification and draft graphs == eager), then the round-cost sweep on the 27B and
# 35B-A3B shapes (bench/bench_spec_cuda.py).   usage: tools/gpu/spec_check.sh OUT_DIR [TEST_FILTER]
set -uo pipefail
out=${1:?usage: tools/gpu/spec_check.sh OUT_DIR [TEST_FILTER]}
filter=${2:-}
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
echo "== GPU tests"
timeout 90 "$py" -m pytest -m gpu tests/test_speculative_cuda.py ${filter:+-k "$filter"} -q -rs \
  -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== round costs (27B, 35B-A3B)"
timeout "${SPEC_BENCH_TIMEOUT:-240}" "$py" bench/bench_spec_cuda.py --out "$out" --reps "${SPEC_REPS:-4}" 2>&1 |
  tee "$out/bench.log" | tail -80
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
