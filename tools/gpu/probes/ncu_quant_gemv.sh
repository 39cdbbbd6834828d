#!/usr/bin/env bash
# On the GPU machine, after a build (build/gpu/env.sh sourced): Nsight Compute's view of the
# quantized decode GEMVs at m = 1 on the 27B shapes: throughput against the memory system's
# peak, warp stall reasons, issue activity and occupancy of one launch per shape, with the
# launcher variant the committed table picks (gemv_quant_measured.inc). The clocks are left
# alone (--clock-control none). Writes OUT_DIR/ncu_<name>.txt.
#   usage: tools/gpu/probes/ncu_quant_gemv.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tools/gpu/probes/ncu_quant_gemv.sh OUT_DIR}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu"; exit 1; }
# name dtype rows k variant
while read -r name dtype rows k variant; do
  timeout 120 "$ncu" --clock-control none --kernel-name regex:gemv_quant --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --print-details all \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 -c "from ninfer import _core; g = _core.CudaQuantGemv(0); g.time_gemv('$dtype', [$rows], $k, 1, $variant, 4)" \
    >"$out/ncu_$name.txt" 2>&1
  echo "== $name ($dtype $rows x $k, variant $variant): rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc|Achieved Occupancy|Registers Per|Theoretical Occupancy|Stall|One or More Eligible|No Eligible|Active Warps Per Scheduler|Eligible Warps|stall|Warp Cycles" \
    "$out/ncu_$name.txt" | head -30
done <<'SHAPES'
fp8_down fp8 5120 17408 30
fp8_in_proj fp8 16384 5120 24
nvfp4_in_proj nvfp4 16384 5120 35
nvfp4_down nvfp4 5120 17408 32
SHAPES
