#!/usr/bin/env bash
# Triton's own load generator, perf_analyzer, against `carpool serve`.
#
#   bash benchmarks/perf_analyzer/setup.sh                    # once
#   bash benchmarks/perf_analyzer/run.sh                      # the MLP, concurrency 1:64:8
#   bash benchmarks/perf_analyzer/run.sh demo                 # the built-in demo model
#   bash benchmarks/perf_analyzer/run.sh mlp --measurement-interval 3000   # extra PA flags
#
# Starts `carpool serve` (pinned to CPU $SERVER_CPUS, default 0) with --max-batch-size 32,
# prints the model config perf_analyzer reads first, runs perf_analyzer (pinned to CPU
# $CLIENT_CPUS, default 1) with `-i http --concurrency-range $RANGE -s $STABILITY`, then
# prints carpool's view (batches, mean batch size, request outcomes) and stops the server
# with SIGTERM (a graceful drain). Exit status: perf_analyzer's.
#
# Environment: PORT (a free one), RANGE (1:64:8), STABILITY (30, percent), SERVER_CPUS (0),
# CLIENT_CPUS (1), PYTHON (python3: an interpreter that can import carpool[server]),
# CARPOOL (the command that starts carpool; default "$PYTHON -m carpool").
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="${1:-mlp}"
shift || true
PORT="${PORT:-}"
RANGE="${RANGE:-1:64:8}"
STABILITY="${STABILITY:-30}"
SERVER_CPUS="${SERVER_CPUS:-0}"
CLIENT_CPUS="${CLIENT_CPUS:-1}"
PYTHON="${PYTHON:-python3}"
CARPOOL="${CARPOOL:-$PYTHON -m carpool}"

if [ ! -f "$HERE/env.sh" ]; then
    echo "run.sh: perf_analyzer is not installed; run: bash $HERE/setup.sh" >&2
    exit 2
fi
# shellcheck disable=SC1091
. "$HERE/env.sh"

case "$MODEL" in
    mlp) TARGET="benchmarks.harness.http_models:mlp" ;;
    demo) TARGET="demo" ;;
    *) echo "run.sh: model must be 'mlp' or 'demo', got '$MODEL'" >&2; exit 2 ;;
esac

pinned() {  # pinned CPUS: the taskset prefix for CPUS, or nothing where they do not exist
    if command -v taskset >/dev/null && taskset -c "$1" true 2>/dev/null; then
        echo "taskset -c $1"
    fi
}
if [ -z "$PORT" ]; then
    PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi

LOG="$(mktemp /tmp/carpool_pa_server.XXXXXX.log)"
cd "$ROOT"
export PYTHONPATH="$ROOT:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086  # command lines; taskset execs, so $! is the server itself
$(pinned "$SERVER_CPUS") $CARPOOL serve "$TARGET" --max-batch-size 32 \
    --access-log false --port "$PORT" --grpc-port 0 >"$LOG" 2>&1 &
SERVER=$!
stop() {
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER"
        wait "$SERVER" || echo "run.sh: carpool serve exited with $?" >&2
    fi
}
trap stop EXIT

URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 300); do
    if curl -fs "$URL/v2/health/ready" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "run.sh: carpool serve exited early:" >&2; cat "$LOG" >&2; exit 1
    fi
    sleep 0.1
done
if ! kill -0 "$SERVER" 2>/dev/null || ! curl -fs "$URL/v2/health/ready" >/dev/null; then
    echo "run.sh: carpool serve is not ready on port $PORT:" >&2; cat "$LOG" >&2; exit 1
fi

echo "== $CARPOOL serve $TARGET --max-batch-size 32 (CPU $SERVER_CPUS), perf_analyzer (CPU $CLIENT_CPUS) =="
echo "-- GET /v2/models/$MODEL/config (what perf_analyzer reads first):"
curl -fsS "$URL/v2/models/$MODEL/config"
echo
echo "-- $(LD_LIBRARY_PATH="$PERF_ANALYZER_LIBS" "$PERF_ANALYZER" --version 2>&1 | head -1)"
# shellcheck disable=SC2207
CMD=($(pinned "$CLIENT_CPUS") "$PERF_ANALYZER" -m "$MODEL" -u "127.0.0.1:$PORT" -i http
     --concurrency-range "$RANGE" -s "$STABILITY" "$@")
echo "+ ${CMD[*]}"
set +e
LD_LIBRARY_PATH="$PERF_ANALYZER_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${CMD[@]}"
RC=$?
set -e
[ "$RC" -eq 0 ] || echo "run.sh: perf_analyzer exited with $RC"

echo "-- carpool's view (/metrics):"
curl -fsS "$URL/metrics" | grep -E '^carpool_(requests_total|batcher_requests_total|batches_total|batch_size_(sum|count))\{' || true
curl -fsS "$URL/metrics" | awk '
    /^carpool_batch_size_sum\{/ {s+=$2} /^carpool_batch_size_count\{/ {c+=$2}
    END {if (c) printf "mean batch size over the whole run: %.2f rows (%d rows / %d batches)\n", s/c, s, c}'
if grep -qE 'ERROR|Traceback' "$LOG"; then
    echo "-- server log had errors:"; grep -E -A5 'ERROR|Traceback' "$LOG" | head -50
fi
exit "$RC"
