#!/usr/bin/env bash
# Run Infinity (offline, CPU, loopback only) in the foreground on a local checkpoint directory.
#
#   bash bench/infinity/serve.sh [MODEL_DIR] [PORT] [VENV_DIR] [extra infinity_emb v2 flags...]
#   defaults: /tmp/infinity-clip 7997 /tmp/infinity-venv
#
# Readiness: GET http://127.0.0.1:PORT/health answers 200 once the model is loaded and warmed up.
# INFINITY_PIDFILE=FILE: write the server's pid there (the script execs, so it is this shell's pid);
# stop it with `kill "$(cat FILE)"` (SIGTERM: uvicorn shuts down cleanly).
set -euo pipefail

MODEL_DIR="${1:-/tmp/infinity-clip}"
PORT="${2:-7997}"
VENV="${3:-/tmp/infinity-venv}"
shift $(( $# < 3 ? $# : 3 ))

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DO_NOT_TRACK=1 INFINITY_ANONYMOUS_USAGE_STATS=0  # no telemetry attempts
# infinity_emb creates an (empty) .infinity_cache in $INFINITY_HOME, else $HF_HOME, else the CWD.
export INFINITY_HOME="${INFINITY_HOME:-/tmp/infinity-home}"

if [[ -n "${INFINITY_PIDFILE:-}" ]]; then echo $$ > "$INFINITY_PIDFILE"; fi
exec "$VENV/bin/infinity_emb" v2 \
    --model-id "$MODEL_DIR" \
    --served-model-name "$(basename "$MODEL_DIR")" \
    --host 127.0.0.1 --port "$PORT" \
    --device cpu --engine torch \
    "$@"
