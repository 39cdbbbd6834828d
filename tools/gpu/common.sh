# Sourced by the tools/gpu/*.sh scripts on the GPU machine (bash, from the repository root).
# install_wheels: the packages the GPU image lacks travel as wheels in .whl/ (see check.sh).
# build_extension LOG: build the CUDA extension (tools/gpu/build.sh) and source its env.sh,
# or print the log's tail and return 1.
# peer_build_start: llama.cpp's llama-bench built from .llama-peer/ in the background (all but two
# cores, low priority: tools/gpu/llama_peer.sh). peer_run OUT [llama_peer.sh options]: waits for
# that build, runs the peer (PEER_S seconds at most) and leaves llama_peer.md and peer_log.txt in
# OUT; returns 1 if either failed.

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
  local out=$1 rc=0
  shift
  wait "$peer_builder" || { rc=1; tail -30 /tmp/peer-build.out; }
  grep "^build:" /tmp/peer-build/build.log
  timeout "${PEER_S:-240}" tools/gpu/llama_peer.sh /tmp/peer "$@" >/tmp/peer.out 2>&1 || rc=1
  tail -30 /tmp/peer.out
  cp /tmp/peer/llama_peer.md "$out/" 2>/dev/null
  cat /tmp/peer-build/build.log /tmp/peer/llama_peer.log 2>/dev/null | tail -150 >"$out/peer_log.txt"
  return "$rc"
}
