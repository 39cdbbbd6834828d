#!/usr/bin/env bash
# On the GPU machine, one call for the merged tree: build + every GPU test (check.sh), the 27B
# quantized benchmark with the launcher's committed choices (no per-run table), the 35B-A3B
# quantized decode benchmark, then a short serving table (27B fp8 at c = 16 and 8k, 35B-A3B bf16).
# Compact results land in OUT_DIR (few files: the device returns at most 8).
# PEER=1 adds llama.cpp's llama-bench on the 27B shape (tools/gpu/llama_peer.sh; carry .llama-peer/):
# built from the carried source in the background while the GPU tests run (all but two cores, low
# priority), run after NInfer's benchmarks; a binary built here comes back split in 15 MiB parts.
#   usage: tools/gpu/release_check.sh OUT_DIR   (SERVE=0 skips the serving table)
set -uo pipefail
out=${1:?usage: tools/gpu/release_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
source tools/gpu/common.sh
status=0
if [ "${PEER:-0}" = 1 ]; then
  stamp "llama.cpp build in the background"
  peer_build_start
fi
stamp "check.sh (build + GPU tests)"
NINFER_BENCH=none tools/gpu/check.sh "$out/check" >/tmp/check.out 2>&1 || status=1
tail -40 /tmp/check.out
install_wheels
# shellcheck disable=SC1091
source build/gpu/env.sh
stamp "27B fp8/nvfp4 (committed GEMV choices)"
timeout "${QUANT_TIMEOUT:-150}" python3 bench/bench_cuda_quant.py --out /tmp/q --dtypes fp8,nvfp4 --steps 8 \
  --contexts "1024:1,4,8,16;8192:1" >/tmp/q.log 2>&1 || status=1
cp /tmp/q/results_quant.md "$out/quant_27b.md" 2>/dev/null
grep -vE "^- |^gemv " /tmp/q.log | tail -30
stamp "35B-A3B quantized decode"
timeout "${MOE_TIMEOUT:-120}" python3 bench/bench_cuda_moe_quant.py --out /tmp/moe --contexts 1024 \
  >/tmp/moe.log 2>&1 || status=1
tail -45 /tmp/moe.log | tee "$out/moe_35b.txt"
if [ "${SERVE:-1}" = 1 ]; then
  stamp "serving table"
  BUILD=0 TOTAL_S=${SERVE_S:-50} SHAPES="qwen3.6-27b" DTYPES="fp8" TTFT_PROBE="" \
    QUANT_RUNS="1024:16:22 8192:1:10" timeout 150 tools/gpu/serve_table.sh /tmp/st >/tmp/st.log 2>&1 || status=1
  BUILD=0 CEILINGS=0 TOTAL_S=${SERVE_S:-50} SHAPES="qwen3.6-35b-a3b" DTYPES="bf16" TTFT_PROBE="" \
    RUNS_qwen3_6_35b_a3b="1024:1:4 1024:16:12 8192:1:4" timeout 150 tools/gpu/serve_table.sh /tmp/st35 >>/tmp/st.log 2>&1 ||
    status=1
  cat /tmp/st/results_serve.md /tmp/st35/results_serve.md >"$out/serve.md" 2>/dev/null
  tail -30 /tmp/st.log
fi
if [ "${PEER:-0}" = 1 ]; then
  stamp "llama.cpp peer (after its build)"
  # shellcheck disable=SC2086  # PEER_ARGS: llama_peer.py options
  peer_run "$out" llama_peer ${PEER_ARGS:---depths 1024 8192} || status=1
  # Room for the binary's parts among the device's 8 returned files.
  cat "$out/check/machine.txt" "$out/check/build.log" >"$out/check/machine_build.txt" 2>/dev/null &&
    rm -f "$out/check/machine.txt" "$out/check/build.log"
  if [ ! -f .llama-peer/llama-bench-cuda.tar.xz ] && [ -x /tmp/llama-peer/llama-bench ]; then
    mkdir -p /tmp/pack && strip -o /tmp/pack/llama-bench /tmp/llama-peer/llama-bench &&
      tar -C /tmp/pack -cf - llama-bench | xz -6 -T"$(nproc)" >/tmp/llama-bench-cuda.tar.xz &&
      split -b 15M -d /tmp/llama-bench-cuda.tar.xz "$out/llama-bench-cuda.tar.xz.part-" &&
      ls -l /tmp/llama-bench-cuda.tar.xz
  fi
fi
stamp "end (status $status)"
exit "$status"
