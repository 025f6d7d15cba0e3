#!/usr/bin/env bash
# Build llama.cpp's llama-server (the C++ peer of benchmarks.streams.llm) from the llama.cpp
# sources inside llama-cpp-python's source distribution, into benchmarks/.llama-server/.
# Same llama.cpp as the installed llama-cpp-python; CPU only; safe to re-run.
#
#   bash benchmarks/streams/setup_llama_server.sh          # ~10+ minutes on 2 cores
#   JOBS=4 LLAMA_CPP_PYTHON=0.3.36 bash benchmarks/streams/setup_llama_server.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DEST="$ROOT/benchmarks/.llama-server"
PYTHON="${PYTHON:-python3}"
VERSION="${LLAMA_CPP_PYTHON:-0.3.36}"
JOBS="${JOBS:-2}"

mkdir -p "$DEST"
echo '*' > "$DEST/.gitignore"
if [ -x "$DEST/llama-server" ]; then
    echo "OK: $DEST/llama-server exists"
    exit 0
fi
cd "$DEST"
if [ ! -d "src" ]; then
    "$PYTHON" -m pip download "llama-cpp-python==$VERSION" --no-deps --no-binary llama-cpp-python -d sdist
    mkdir -p src
    tar -xzf sdist/llama_cpp_python-"$VERSION".tar.gz -C src --strip-components=1
fi
cmake -S src/vendor/llama.cpp -B build \
    -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
cmake --build build --target llama-server -j "$JOBS"
cp build/bin/llama-server "$DEST/llama-server"
echo "OK: $DEST/llama-server"
