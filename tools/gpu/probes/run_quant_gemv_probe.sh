#!/usr/bin/env bash
# On the GPU machine: build quant_gemv_probe.cu once per dequantization (in parallel) and run
# each, appending to OUT_DIR/probe.txt.   usage: run_quant_gemv_probe.sh OUT_DIR [DEQ...]
# A DEQ written Nt (e.g. 2t) builds the probe with TILED=1 (8-row groups stored unit-major).
set -uo pipefail
out=${1:?usage: run_quant_gemv_probe.sh OUT_DIR [DEQ...]}
shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
deqs=${*:-0 1 2 3 4 10 11 12}
for d in $deqs; do
  tiled=0
  [ "${d%t}" != "$d" ] && tiled=1
  nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -I"$here/../../../native" -DDEQ="${d%t}" -DTILED=$tiled \
    -o "/tmp/qgp$d" "$here/quant_gemv_probe.cu" >"/tmp/build$d.log" 2>&1 &
done
wait
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv >"$out/probe.txt"
for d in $deqs; do
  "/tmp/qgp$d" >>"$out/probe.txt" 2>&1 || echo "DEQ $d failed rc=$?" >>"$out/probe.txt"
done
cat "$out/probe.txt"
