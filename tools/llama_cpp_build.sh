#!/usr/bin/env bash
# llama.cpp for the peer benchmarks, from the source the llama-cpp-python sdist vendors (pinned
# by version and sha256 below), built here with only the targets the benchmarks run.
#   usage: tools/llama_cpp_build.sh WORK_DIR cpu|cuda|source
#     cpu     llama-server + llama-bench for this CPU (GGML_NATIVE=ON; on an AMX CPU its AVX-512
#             flags one by one, AMX off): bench/serve_peer_cpu.py
#             --peer-server WORK_DIR/build-cpu/bin/llama-server
#     cuda    llama-bench for sm_90a (CUDA 13 nvcc; cuBLAS from the nvidia-cublas wheel, installed
#             into WORK_DIR/cublas since this machine's toolkit has none), statically linked
#             ggml/llama, stripped: .llama-peer/llama-bench-cuda.tar.xz for tools/gpu/llama_peer.sh
#     source  the trimmed source tree (ggml, src, common, tools; no other backends, models or
#             docs) as .llama-peer/llama-cpp-src.tar.xz, for tools/gpu/llama_peer.sh to build there
# JOBS (default 2) and NICE (default 19) set the build's parallelism and priority.
set -euo pipefail
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CUBLAS=nvidia-cublas==13.0.2.14 # CUDA 13.0, as nvcc here; the GPU image's 13.x loads it
work=${1:?usage: tools/llama_cpp_build.sh WORK_DIR cpu|cuda|source}
mode=${2:?usage: tools/llama_cpp_build.sh WORK_DIR cpu|cuda|source}
repo=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-2}
niceness=${NICE:-19}
py=${PYTHON:-python3}
cuda=${CUDA_HOME:-/usr/local/cuda-13.0}
mkdir -p "$work" "$repo/.llama-peer"
work=$(cd "$work" && pwd)

sdist="$work/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  # --no-build-isolation: pip only reads the sdist's metadata (with an isolated build it would
  # first build CMake from source to do that).
  "$py" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$work" \
    "llama-cpp-python==$VERSION"
fi
echo "$SHA256  $sdist" | sha256sum -c -
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$src" ] || tar -xzf "$sdist" -C "$work"

common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF)
case "$mode" in
cpu)
  # This machine's instruction set, but never ggml's AMX matmul: on an AMX CPU the pinned
  # source's native build segfaults in ggml_backend_amx_mul_mat on every prompt batch (Q8_0
  # SmolLM2 and the random qwen35 GGUFs alike, 2026-12-03), so there the AVX-512 family the CPU
  # reports is named one by one instead of -march=native.
  isa=(-DGGML_NATIVE=ON)
  if grep -qw amx_int8 /proc/cpuinfo; then
    isa=(-DGGML_NATIVE=OFF)
    for pair in avx512f:GGML_AVX512 avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI \
      avx512_bf16:GGML_AVX512_BF16 avx_vnni:GGML_AVX_VNNI; do
      grep -qw "${pair%%:*}" /proc/cpuinfo && isa+=("-D${pair##*:}=ON")
    done
  fi
  cmake -S "$src" -B "$work/build-cpu" "${common[@]}" "${isa[@]}" -DLLAMA_BUILD_SERVER=ON
  nice -n "$niceness" ninja -C "$work/build-cpu" -j "$jobs" llama-server llama-bench
  echo "$work/build-cpu/bin/llama-server"
  ;;
cuda)
  cublas="$work/cublas/nvidia/cu13"
  if [ ! -f "$cublas/lib/libcublas.so.13" ]; then
    "$py" -m pip download --no-deps --only-binary=:all: -d "$work/whl" "$CUBLAS"
    mkdir -p "$work/cublas"
    (cd "$work/cublas" && unzip -q -o "$work"/whl/nvidia_cublas-*.whl)
  fi
  # No driver here: link against a stub libcuda.so.1 that defines the driver entry points
  # ggml-cuda uses (the GPU machine's driver provides the real one at run time).
  stub="$work/stub"
  mkdir -p "$stub"
  [ -f "$stub/libcuda.so" ] || { echo 'void cuGetErrorString(void) {}' >"$stub/stub.c" &&
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/stub.c"; }
  b="$work/build-cuda"
  cmake -S "$src" -B "$b" "${common[@]}" -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF \
    -DCUDAToolkit_ROOT="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DCUDA_cublas_LIBRARY="$cublas/lib/libcublas.so.13" \
    -DCUDA_cublasLt_LIBRARY="$cublas/lib/libcublasLt.so.13" \
    -DCUDA_cuda_driver_LIBRARY="$stub/libcuda.so" \
    -DCMAKE_CUDA_FLAGS="-I$cublas/include" -DCMAKE_CXX_FLAGS="-I$cublas/include"
  nice -n "$niceness" ninja -C "$b" -j "$jobs" ggml-cuda
  nm "$b/ggml/src/ggml-cuda/libggml-cuda.a" | awk '$1=="U" && $2 ~ /^cu[A-Z]/ {print "void " $2 "(void) {}"}' |
    sort -u >"$stub/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/stub.c"
  nice -n "$niceness" ninja -C "$b" -j "$jobs" llama-bench
  rm -rf "$work/pack" && mkdir -p "$work/pack"
  strip -o "$work/pack/llama-bench" "$b/bin/llama-bench"
  tar -C "$work/pack" -cf - llama-bench | xz -6 -T"$jobs" >"$repo/.llama-peer/llama-bench-cuda.tar.xz"
  ls -l "$repo/.llama-peer/llama-bench-cuda.tar.xz"
  ;;
source)
  skip=()
  for backend in et metal hexagon sycl vulkan opencl; do skip+=("--exclude=llama.cpp/ggml/src/ggml-$backend"); done
  tar -C "$src/.." "${skip[@]}" --exclude=llama.cpp/tools/ui -cf - llama.cpp/CMakeLists.txt \
    llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/common \
    llama.cpp/vendor llama.cpp/tools llama.cpp/LICENSE llama.cpp/licenses |
    xz -6 -T"$jobs" >"$repo/.llama-peer/llama-cpp-src.tar.xz"
  ls -l "$repo/.llama-peer/llama-cpp-src.tar.xz"
  ;;
*)
  echo "unknown mode $mode (cpu, cuda or source)"
  exit 1
  ;;
esac
