# Sourced by the tools/gpu/*.sh scripts on the GPU machine (bash, from the repository root).
# install_wheels: the packages the GPU image lacks travel as wheels in .whl/ (see check.sh).
# build_extension LOG: build the CUDA extension (tools/gpu/build.sh) and source its env.sh,
# or print the log's tail and return 1.

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
