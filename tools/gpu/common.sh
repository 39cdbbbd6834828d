# Sourced by the tools/gpu/*.sh scripts on the GPU machine (bash, from the repository root).
# install_wheels: the packages the GPU image lacks travel as wheels in .whl/ (see check.sh).
# build_extension LOG: build the CUDA extension (tools/gpu/build.sh) and source its env.sh,
# or print the log's tail and return 1.
# stamp MESSAGE: the message after the seconds since this file was sourced.
# peer_build_start: llama.cpp's llama-bench built from .llama-peer/ in the background (all but two
# cores, low priority: tools/gpu/llama_peer.sh). peer_run OUT NAME [llama_peer.sh options]: waits
# for that build (the first time), runs the peer into /tmp/NAME (PEER_S seconds at most) and
# leaves NAME.md and NAME_log.txt in OUT (its JSON stays at /tmp/NAME/llama_peer.json); returns 1
# if either failed.

common_t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - common_t0)) s] $*"; }

install_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl &&
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

build_extension() {
  echo "== build"
  if ! tools/gpu/build.sh "$1"; then
    tail -40 "$1"
    return 1
  fi
  grep "build rc" "$1"
  # shellcheck disable=SC1091
  source build/gpu/env.sh
}

peer_build_start() {
  LLAMA_BUILD_ONLY=1 LLAMA_JOBS=$(($(nproc) - 2)) LLAMA_NICE=15 tools/gpu/llama_peer.sh /tmp/peer-build \
    >/tmp/peer-build.out 2>&1 &
  peer_builder=$!
}

peer_run() {
  local out=$1 name=$2 rc=0
  shift 2
  if [ -n "${peer_builder:-}" ]; then
    wait "$peer_builder" || { rc=1; tail -30 /tmp/peer-build.out; }
    peer_builder=
    grep "^build:" /tmp/peer-build/build.log
  fi
  timeout "${PEER_S:-240}" tools/gpu/llama_peer.sh "/tmp/$name" "$@" >"/tmp/$name.out" 2>&1 || rc=1
  tail -30 "/tmp/$name.out"
  cp "/tmp/$name/llama_peer.md" "$out/$name.md" 2>/dev/null
  cat /tmp/peer-build/build.log "/tmp/$name/llama_peer.log" 2>/dev/null | tail -150 >"$out/${name}_log.txt"
  return "$rc"
}
