#!/usr/bin/env bash
# Install Triton's perf_analyzer (a C++ binary) in its own venv, benchmarks/perf_analyzer/.venv.
#
#   bash benchmarks/perf_analyzer/setup.sh
#
# Where the binary comes from: the PyPI package `perf-analyzer` is an empty placeholder and
# current tritonclient wheels no longer ship it, but the tritonclient 2.41.1 manylinux wheel
# carries bin/perf_analyzer. It is a CUDA build that links libcudart.so.12 and libb64.so.0d,
# yet needs no GPU for HTTP load generation: libcudart comes from the
# nvidia-cuda-runtime-cu12 wheel and libb64 from Debian's libb64-0d.
#
# Writes benchmarks/perf_analyzer/env.sh (the binary's path and the folder of libcudart for
# LD_LIBRARY_PATH), which run.sh sources. Safe to re-run. Needs root (or sudo) for apt-get, once.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$HERE/.venv"

if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq libb64-0d
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --only-binary :all: "tritonclient[http]==2.41.1" "nvidia-cuda-runtime-cu12==12.9.79"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PA="$VENV/bin/perf_analyzer"  # the wheel's data scripts land in the venv's bin/
[ -x "$PA" ] || PA="$(find "$VENV" -type f -name perf_analyzer -perm -u+x | head -1)"
CUDART="$(find "$SITE/nvidia" -name 'libcudart.so.12*' | head -1)"
if [ -z "$PA" ] || [ -z "$CUDART" ]; then
    echo "setup: perf_analyzer ($PA) or libcudart.so.12 ($CUDART) not found" >&2
    exit 1
fi
CUDART_DIR="$(dirname "$CUDART")"
cat > "$HERE/env.sh" <<ENV
# Written by setup.sh. Source it, then run perf_analyzer as
#   LD_LIBRARY_PATH="\$PERF_ANALYZER_LIBS" "\$PERF_ANALYZER" ...
# (PATH is left alone: the venv's bin/ also holds a python without carpool.)
export PERF_ANALYZER="$PA"
export PERF_ANALYZER_LIBS="$CUDART_DIR"
ENV
# shellcheck disable=SC1091
. "$HERE/env.sh"
export LD_LIBRARY_PATH="$PERF_ANALYZER_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$PA" | grep -q 'not found'; then
    ldd "$PA" | grep 'not found' >&2
    echo "setup: perf_analyzer is missing shared libraries (above)" >&2
    exit 1
fi
"$PA" --version
echo "OK: perf_analyzer at $PA (libcudart from $CUDART_DIR; see $HERE/env.sh)"
