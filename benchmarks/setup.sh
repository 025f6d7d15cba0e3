#!/usr/bin/env bash
# Create benchmarks/.venv with carpool (editable, from the repo root) plus the
# benchmark-only requirements (Ray Serve, numpy, ...). Safe to re-run.
#
#   bash benchmarks/setup.sh            # from anywhere
#   PYTHON=python3.11 bash benchmarks/setup.sh
#   bash benchmarks/setup.sh --embeddings   # only: infinity-emb for benchmarks.embeddings.peers
#
# --embeddings makes benchmarks/.venv-embeddings instead, a venv of its own (infinity-emb's
# pins clash with carpool's environment) holding requirements-embeddings.txt; it ignores
# itself in git. benchmarks.embeddings.peers finds it there and runs infinity with its python.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$HERE/.venv"

if [ "${1:-}" = "--embeddings" ]; then
    EMB="$HERE/.venv-embeddings"
    if [ ! -x "$EMB/bin/python" ]; then
        "$PYTHON" -m venv "$EMB"
    fi
    echo '*' > "$EMB/.gitignore"
    "$EMB/bin/python" -m pip install -r "$HERE/requirements-embeddings.txt"
    "$EMB/bin/python" -c "import importlib.metadata as m; print('infinity-emb', m.version('infinity-emb'))"
    echo "OK: python -m benchmarks.embeddings.peers runs infinity with $EMB/bin/python"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip wheel
"$VENV/bin/python" -m pip install -r "$HERE/requirements.txt"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -f "$SITE/carpool-src.pth"
if [ -f "$ROOT/pyproject.toml" ] && "$VENV/bin/python" -m pip install -e "$ROOT[server,test]"; then
    :
else
    # No installable project at the repo root (yet): expose src/ through a
    # .pth file so `import carpool` works in the venv all the same.
    echo "$ROOT/src" > "$SITE/carpool-src.pth"
    echo "WARNING: could not 'pip install -e $ROOT'; added $ROOT/src to the venv via carpool-src.pth" >&2
fi

"$VENV/bin/python" - <<'PY'
from ray import serve
import numpy, ray
print("ray", ray.__version__, "numpy", numpy.__version__, "serve.batch:", serve.batch)
try:
    import carpool
    print("carpool:", getattr(carpool, "__file__", carpool))
except Exception as e:  # core may not have landed yet
    print("carpool not importable yet:", type(e).__name__, e)
PY
echo "OK: activate with  source $VENV/bin/activate"
