#!/usr/bin/env bash
# Incremental developer build: configures build/dev once, rebuilds, and links the resulting
# extension into python/ninfer so that `PYTHONPATH=python pytest` uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/dev}
py=${PYTHON:-python3}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNINFER_CUDA="${NINFER_CUDA:-OFF}" \
    -DPython_EXECUTABLE="$(command -v "$py")" \
    -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')"
fi
cmake --build "$build" -j "${JOBS:-2}"
so=$(ls "$build"/_core*.so)
ln -sf "$(realpath "$so")" "python/ninfer/$(basename "$so")"
echo "built $so"
