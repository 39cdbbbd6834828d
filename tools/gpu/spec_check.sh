#!/usr/bin/env bash
# On the GPU machine (issue 15): build, run the gpu-marked speculative tests, then the round-cost
# benchmark on the 27B shape (bench/bench_spec_cuda.py).   usage: tools/gpu/spec_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/spec_check.sh OUT_DIR}
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
timeout 120 "$py" -m pytest -m gpu tests/test_speculative_cuda.py -q -rs -p no:cacheprovider -o addopts="" 2>&1 |
  tee "$out/tests.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== round cost (27B shape)"
timeout 300 "$py" bench/bench_spec_cuda.py --out "$out" 2>&1 | tee "$out/bench.log" | tail -50
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
