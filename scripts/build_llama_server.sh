#!/bin/sh
# Build llama.cpp's llama-server (CPU only) from the sources inside the llama-cpp-python
# sdist on PyPI, for the benchmarks that put it beside frink-mlx (benchmarks/README.md).
# Not part of CI or `make test`: a release build takes ~10-20 minutes on 2 cores.
#
#   scripts/build_llama_server.sh [OUT_DIR]     -> OUT_DIR/bin/llama-server
set -eu
OUT=$(realpath -m "${1:-build/llama-server}")
PY=${PYTHON:-.venv/bin/python}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT/sdist" "$OUT/src"
if ! ls "$OUT"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    "$PY" -m pip download llama-cpp-python --no-binary :all: --no-deps -d "$OUT/sdist"
fi
SDIST=$(ls "$OUT"/sdist/llama_cpp_python-*.tar.gz | tail -1)
tar xzf "$SDIST" -C "$OUT/src"
SRC=$(ls -d "$OUT"/src/llama_cpp_python-*/vendor/llama.cpp | tail -1)
GEN=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
cmake -S "$SRC" -B "$OUT/build" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build "$OUT/build" --target llama-server -j "$JOBS"
mkdir -p "$OUT/bin"
cp "$OUT/build/bin/llama-server" "$OUT/bin/llama-server"
"$OUT/bin/llama-server" --version
echo "built $OUT/bin/llama-server"
