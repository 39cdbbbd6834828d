#!/usr/bin/env bash
# On the GPU machine: the probe of the quantized GEMV (in the background, while the extension
# builds), then the quantized GEMV tests and the 27B quantized benchmark with the fastest
# variant per shape (the sector kernel among them).   usage: tools/gpu/sectors_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/sectors_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
source tools/gpu/common.sh
install_wheels
tools/gpu/probes/run_quant_gemv_probe.sh /tmp/probe 1 2 11 14 >/dev/null 2>&1 &
probe=$!
build_extension /tmp/build.log || exit 1
wait "$probe"
python3 - /tmp/probe/probe.txt >"$out/probe_best.txt" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split("|")]
    if len(f) == 7:
        us = float(f[3].split()[0])
        key = (f[0], f[1])
        if key not in best or us < best[key][0]:
            best[key] = (us, f[2], f[4], f[5], f[6])
for key, v in best.items():
    print(" | ".join(key), "|", " | ".join(str(x) for x in v))
PY
cp /tmp/probe/probe.txt "$out/probe.txt"
cat "$out/probe_best.txt"
echo "== quantized GEMV tests"
timeout "${GEMV_TEST_TIMEOUT:-150}" python3 -m pytest -m gpu tests/test_cuda_quant_gemv.py -q -x -p no:cacheprovider \
  -o addopts="" 2>&1 | tee "$out/tests.log" | grep -vE "^$|^[.s]+ *(\[|$)" | tail -15
echo "== benchmark"
timeout "${GEMV_BENCH_TIMEOUT:-200}" python3 bench/bench_cuda_quant.py --out "$out/bench" --dtypes fp8,nvfp4 --steps 8 \
  --pick-fastest --contexts "${GEMV_CONTEXTS:-1024:1,4,8,16;8192:1}" 2>&1 | tee "$out/bench.log" | grep -vE "^- |^gemv " | tail -30
