#!/usr/bin/env bash
# End-to-end check: start Infinity on the checkpoint, wait for /health, run probe.py, stop it.
#
#   bash bench/infinity/smoke.sh [MODEL_DIR] [PORT] [VENV_DIR]
#   defaults: /tmp/infinity-clip 7997 /tmp/infinity-venv
# The checkpoint must exist (bench/infinity/make_clip.py MODEL_DIR); the venv must be set up (setup.sh).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
MODEL_DIR="${1:-/tmp/infinity-clip}"
PORT="${2:-7997}"
VENV="${3:-/tmp/infinity-venv}"
LOG="$(mktemp /tmp/infinity-smoke.XXXXXX.log)"
PIDFILE="$(mktemp /tmp/infinity-smoke.XXXXXX.pid)"

INFINITY_PIDFILE="$PIDFILE" bash "$HERE/serve.sh" "$MODEL_DIR" "$PORT" "$VENV" >"$LOG" 2>&1 &
stop() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$PIDFILE"
}
trap stop EXIT

start=$(date +%s.%N)
for _ in $(seq 1 1200); do  # up to 120 s
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
        python3 -c "print(f'infinity healthy after {$(date +%s.%N) - $start:.1f} s (log: $LOG)')"
        "$VENV/bin/python" "$HERE/probe.py" "http://127.0.0.1:$PORT"
        exit 0
    fi
    if [[ -s "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "infinity exited during startup; last log lines:" >&2
        tail -30 "$LOG" >&2
        exit 1
    fi
    sleep 0.1
done
echo "infinity not healthy after 120 s; log: $LOG" >&2
exit 1
