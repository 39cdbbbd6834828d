#!/usr/bin/env bash
# On the GPU machine: build the extension with the CUDA backend (sm_90a) into build/gpu, link it
# into python/ninfer/, and write build/gpu/env.sh (PYTHONPATH, LD_LIBRARY_PATH for cuBLAS) for
# later steps to source.   usage: tools/gpu/build.sh LOG_FILE [JOBS]
set -uo pipefail
log=$(realpath -m "${1:?usage: tools/gpu/build.sh LOG_FILE [JOBS]}")
jobs=${2:-$(nproc)}
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}

# cuBLAS is opened at run time: the toolkit's copy, else the one in the Python wheels.
wheel_libs=$("$py" - <<'PY'
import glob, os, site
dirs = set()
for base in site.getsitepackages():
    for lib in glob.glob(os.path.join(base, "nvidia", "**", "libcublas.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)

echo "== build $(pwd)" >>"$log"
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNINFER_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DPython_EXECUTABLE="$(command -v "$py")" \
  -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" >>"$log" 2>&1 &&
  cmake --build build/gpu -j "$jobs" >>"$log" 2>&1
build_rc=$?
echo "build rc=$build_rc in $(( $(date +%s) - start )) s" >>"$log"
[ "$build_rc" -eq 0 ] || exit 1
so=$(ls build/gpu/_core*.so)
ln -sf "$(realpath "$so")" "python/ninfer/$(basename "$so")"
cat >build/gpu/env.sh <<ENV
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/python\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${wheel_libs}:\${LD_LIBRARY_PATH:-}"
ENV
