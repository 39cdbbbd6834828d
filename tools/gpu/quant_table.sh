#!/usr/bin/env bash
# On the GPU machine: issue 14's benchmark table in one call — each weight format (fp8, nvfp4)
# with each KV format (bf16, fp8) on the 27B and/or 35B-A3B shapes against its floor, and
# llama.cpp's llama-bench (Q8_0, Q4_K_M) on the 27B shape in the same call; merged by
# bench/quant_table.py into OUT_DIR/quant_table.md. Stages by environment (1 = run):
#   TESTS=1   build + every GPU test first (tools/gpu/check.sh, no benchmarks)
#   DENSE=1   bench/bench_cuda_quant.py on the 27B shape (--skip-gemv, committed GEMV choices)
#   MOE=0     bench/bench_cuda_moe_quant.py on the 35B-A3B shape
#   PEER=0    llama.cpp built from .llama-peer/ in the background from the start (all but two
#             cores, low priority), run once NInfer's benchmarks are done: on the 27B shape with
#             DENSE=1, on the 35B-A3B shape with MOE=1
#   PREFILL=0 bench/bench_cuda_fp8_prefill.py on the 27B shape, then the kernel and idle-gap
#             profile of one FP8 8k prefill (tools/gpu/prefill_profile.py)
#   KV_DTYPES (default bf16,fp8), DTYPES (default fp8,nvfp4), CONTEXTS (27B decode plan,
#   default "1024:1,4,8,16;8192:1,4"), MOE_CONTEXTS (default 1024,8192), STEPS (default 8)
#   usage: tools/gpu/quant_table.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/quant_table.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
source tools/gpu/common.sh
status=0
kv=${KV_DTYPES:-bf16,fp8}
dtypes=${DTYPES:-fp8,nvfp4}
steps=${STEPS:-8}
if [ "${PEER:-0}" = 1 ]; then
  stamp "llama.cpp build in the background"
  peer_build_start
fi
if [ "${TESTS:-1}" = 1 ]; then
  stamp "check.sh (build + GPU tests)"
  NINFER_BENCH=none tools/gpu/check.sh "$out/check" >/tmp/check.out 2>&1 || status=1
  tail -12 /tmp/check.out
fi
install_wheels
[ -f build/gpu/env.sh ] || build_extension "$out/build.log" || exit 1
# shellcheck disable=SC1091
source build/gpu/env.sh
if [ "${DENSE:-1}" = 1 ]; then
  stamp "27B: $dtypes x KV $kv"
  timeout "${DENSE_TIMEOUT:-300}" python3 bench/bench_cuda_quant.py --out /tmp/q --skip-gemv --dtypes "$dtypes" \
    --kv-dtypes "$kv" --steps "$steps" --contexts "${CONTEXTS:-1024:1,4,8,16;8192:1,4}" >/tmp/q.log 2>&1 || status=1
  cp /tmp/q/results_quant.json /tmp/q/results_quant.md "$out/" 2>/dev/null
  grep -E "^\[|FAILED|Error" /tmp/q.log | grep -v "replay" | tail -60
fi
if [ "${MOE:-0}" = 1 ]; then
  stamp "35B-A3B: $dtypes x KV $kv"
  timeout "${MOE_TIMEOUT:-240}" python3 bench/bench_cuda_moe_quant.py --out /tmp/moe --dtypes "$dtypes" \
    --kv-dtypes "$kv" --steps "$steps" --contexts "${MOE_CONTEXTS:-1024,8192}" >/tmp/moe.log 2>&1 || status=1
  cp /tmp/moe/results_moe_quant.json /tmp/moe/results_moe_quant.md "$out/" 2>/dev/null
  grep -E "^\[|FAILED|Error" /tmp/moe.log | tail -40
fi
if [ "${PREFILL:-0}" = 1 ]; then
  stamp "27B FP8 prefill"
  timeout 150 python3 bench/bench_cuda_fp8_prefill.py --out /tmp/pf --shapes qwen3.6-27b --budget-s 100 \
    >/tmp/pf.log 2>&1 || status=1
  grep -E "^\[|rates|FAILED" /tmp/pf.log | tail -12
  timeout 90 python3 tools/gpu/prefill_profile.py --out /tmp/pf 2>&1 | tee /tmp/profile.log | tail -50
  cat /tmp/pf/results_fp8_prefill.md /tmp/profile.log >"$out/prefill.md" 2>/dev/null
fi
if [ "${PEER:-0}" = 1 ]; then
  if [ "${DENSE:-1}" = 1 ]; then
    stamp "llama.cpp peer, 27B (after its build)"
    # shellcheck disable=SC2086  # PEER_ARGS: llama_peer.py options
    peer_run "$out" llama_peer ${PEER_ARGS:---depths 1024 8192 --reps 2} || status=1
    cp /tmp/llama_peer/llama_peer.json "$out/" 2>/dev/null
  fi
  if [ "${MOE:-0}" = 1 ]; then
    stamp "llama.cpp peer, 35B-A3B"
    # shellcheck disable=SC2086
    peer_run "$out" llama_peer_35b --preset qwen3.6-35b-a3b ${PEER_ARGS:---depths 1024 8192 --reps 2} ||
      status=1
    cp /tmp/llama_peer_35b/llama_peer.json "$out/llama_peer_35b.json" 2>/dev/null
  fi
fi
python3 bench/quant_table.py --out "$out/quant_table.md" --quant "$out/results_quant.json" \
  --moe "$out/results_moe_quant.json" --peer "$out/llama_peer.json" "$out/llama_peer_35b.json" >/dev/null ||
  status=1
cat "$out/quant_table.md"
stamp "end (status $status)"
exit "$status"
