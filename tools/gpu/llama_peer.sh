#!/usr/bin/env bash
# On the GPU machine: llama.cpp's llama-bench (CUDA, sm_90a, flash attention on) on random GGUFs
# of the Qwen3.6-27B shape in Q8_0 and Q4_K_M, the peer of NInfer's quantized decode (issue 14).
#   usage: tools/gpu/llama_peer.sh OUT_DIR [bench/llama_peer.py options, e.g. --layers 8 --reps 2]
# Needs, under LLAMA_PEER_DIR (default .llama-peer, carried: it is not in git), either
#   llama-bench-cuda.tar.xz  the binary built by tools/llama_cpp_build.sh cuda (linked against
#                            CUDA 13's cudart and cuBLAS, found here in the image), or
#   llama-cpp-src.tar.xz     the pinned source (tools/llama_cpp_build.sh source), built here on
#                            every core first (timed in OUT_DIR/build.log).
# The gguf wheel travels in .whl/ as for the other GPU scripts. Writes OUT_DIR/llama_peer.json,
# llama_peer.md and llama_peer.log. LLAMA_BUILD_ONLY=1 stops after the build (LLAMA_JOBS, LLAMA_NICE
# set its parallelism and priority); a later run in the same call finds /tmp/llama-peer/llama-bench.
set -uo pipefail
out=${1:?usage: tools/gpu/llama_peer.sh OUT_DIR [llama_peer.py options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
peer=${LLAMA_PEER_DIR:-.llama-peer}
work=/tmp/llama-peer
mkdir -p "$work"

# shellcheck source=tools/gpu/common.sh
source tools/gpu/common.sh
# A caller that installed the wheels already (release_check.sh) may be importing from them.
[[ ":${PYTHONPATH:-}:" == *":/tmp/site:"* ]] || install_wheels

# CUDA 13 runtime and cuBLAS of the image: the toolkit's lib64 or the nvidia-* wheels.
libdirs=$("$py" - <<'EOF'
import glob, site, sys
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
roots += [p + "/nvidia/cu13/lib" for p in site.getsitepackages() + [site.getusersitepackages()]]
roots += glob.glob(sys.prefix + "/lib/python3*/site-packages/nvidia/cu13/lib")
found = []
for lib in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
    for root in roots:
        if glob.glob(f"{root}/{lib}*"):
            found.append(root)
            break
print(":".join(dict.fromkeys(found)))
EOF
)
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ -x "$work/llama-bench" ]; then
  build="CUDA sm_90a, built earlier in this call"
elif [ -f "$peer/llama-bench-cuda.tar.xz" ]; then
  tar -xJf "$peer/llama-bench-cuda.tar.xz" -C "$work"
  build="CUDA sm_90a, carried binary"
elif [ -f "$peer/llama-cpp-src.tar.xz" ]; then
  echo "== build llama-bench from source on $(nproc) cores"
  start=$(date +%s)
  tar -xJf "$peer/llama-cpp-src.tar.xz" -C "$work"
  cublas_inc=$(dirname "$(find / -path /proc -prune -o -name cublas_v2.h -print 2>/dev/null | head -1)")
  cublas_libs=()
  for dir in ${libdirs//:/ }; do
    [ -f "$dir/libcublas.so.13" ] && cublas_libs=(-DCUDA_cublas_LIBRARY="$dir/libcublas.so.13"
      -DCUDA_cublasLt_LIBRARY="$dir/libcublasLt.so.13")
  done
  if ! { cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cublas_libs[@]}" \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=OFF \
    -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_CUDA_FLAGS="-I$cublas_inc" -DCMAKE_CXX_FLAGS="-I$cublas_inc" &&
    nice -n "${LLAMA_NICE:-0}" cmake --build "$work/build" --target llama-bench -j "${LLAMA_JOBS:-$(nproc)}"; } >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    exit 1
  fi
  cp "$work/build/bin/llama-bench" "$work/llama-bench"
  echo "build: $(($(date +%s) - start)) s" | tee -a "$out/build.log"
  build="CUDA sm_90a, built here in $(($(date +%s) - start)) s"
else
  echo "no $peer/llama-bench-cuda.tar.xz or $peer/llama-cpp-src.tar.xz (tools/llama_cpp_build.sh)"
  exit 1
fi
[ "${LLAMA_BUILD_ONLY:-0}" = 1 ] && exit 0
if ldd "$work/llama-bench" | grep "not found"; then
  echo "llama-bench: libraries missing (searched: $libdirs)"
  exit 1
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv >"$out/machine.txt" 2>&1
"$py" bench/llama_peer.py --llama-bench "$work/llama-bench" --out "$out" --build "$build" "$@" 2>&1 |
  tee "$out/llama_peer.log"
exit "${PIPESTATUS[0]}"
