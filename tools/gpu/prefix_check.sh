#!/usr/bin/env bash
# On the GPU machine (issue 13): build, run the prefix-cache GPU tests and the other engine-level
# GPU tests, then the agent-loop benchmark on the 27B hybrid shape within what time is left.
#   usage: tools/gpu/prefix_check.sh OUT_DIR [BENCH_BUDGET_S]
set -uo pipefail
out=${1:?usage: tools/gpu/prefix_check.sh OUT_DIR [BENCH_BUDGET_S]}
budget=${2:-60}
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
timeout 150 "$py" -m pytest -m gpu tests/test_prefix_cache_cuda.py tests/test_server_prefix_cache.py tests/test_server_hybrid_engine.py \
  tests/test_cuda_sampling.py::test_engine_device_sampling_matches_host_sampling -q -rs -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== agent loop (27B shape)"
timeout $((budget * 2 + 60)) "$py" bench/bench_agent_loop.py --out "$out" --budget-s "$budget" 2>&1 |
  tee "$out/bench.log" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "${HOST_TIER_BENCH:-1}" != 0 ]; then
  echo "== host tier (27B shape): two 32k conversations over one device pool, 8192 MiB vs 0"
  timeout 420 "$py" bench/bench_host_tier.py --out "$out" --turns 2 2>&1 |
    tee "$out/host_tier.log" | tail -20
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit "$status"
