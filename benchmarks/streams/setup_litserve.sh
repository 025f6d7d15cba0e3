#!/usr/bin/env bash
# LitServe (the `litserve` row of benchmarks.streams.synthetic: its batched streaming, for
# real) in a venv of its own, benchmarks/.venv-litserve/, which sees this python's packages
# (carpool's, for the synthetic model it serves) but keeps litserve and what it pulls out of
# carpool's environment. The folder ignores itself in git; safe to re-run.
#
#   bash benchmarks/streams/setup_litserve.sh      # under a minute
#   LITSERVE=0.2.19 PYTHON=python3.11 bash benchmarks/streams/setup_litserve.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/benchmarks/.venv-litserve"
PYTHON="${PYTHON:-python3}"
VERSION="${LITSERVE:-0.2.19}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
echo '*' > "$VENV/.gitignore"
"$VENV/bin/python" -m pip install -q "litserve==$VERSION"
"$VENV/bin/python" -c "import importlib.metadata as m; print('litserve', m.version('litserve'))"
echo "OK: python -m benchmarks.streams.synthetic serves the litserve row from $VENV"
