#!/usr/bin/env bash
# Install the Infinity embedding server (infinity-emb 0.0.78) into its own venv, idempotently.
#
#   bash bench/infinity/setup.sh [VENV_DIR]        (default: /tmp/infinity-venv)
#
# Order matters: torch==2.13.0 first (the local CPU wheel; a bare `torch` or a newer one would pull a
# multi-GB CUDA build), then infinity-emb, whose `torch>=2.2.1` is then already satisfied. torchvision
# is never installed (PyPI's build does not import beside this torch, and transformers then breaks).
# transformers & co. are pinned to what pip resolved when this was verified (infinity 0.0.78 needs
# sentence-transformers<4, hence transformers<5); the project's own .venv is never touched.
set -euo pipefail

VENV="${1:-/tmp/infinity-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
INFINITY_VERSION="0.0.78"
PINS=(
    "transformers==4.57.6"
    "sentence-transformers==3.4.1"
    "tokenizers==0.22.2"
    "huggingface_hub==0.36.2"
)

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
fi
PIP=("$VENV/bin/pip" install --quiet)

installed() {  # installed NAME [VERSION]: true when NAME (at VERSION, when given) is already there
    local have
    have="$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" || return 1
    [[ -n "$have" && "$have" == "${2:-}"* ]]
}

if installed torch "$TORCH_VERSION"; then
    echo "torch $TORCH_VERSION already installed"
else
    echo "installing torch==$TORCH_VERSION (CPU)"
    "${PIP[@]}" "torch==$TORCH_VERSION"
fi

if installed infinity-emb "$INFINITY_VERSION" && installed aiohttp && installed transformers "4.57.6"; then
    echo "infinity-emb $INFINITY_VERSION already installed"
else
    echo "installing infinity-emb[server,torch]==$INFINITY_VERSION"
    # torch==$TORCH_VERSION is repeated so the resolver can never swap it for another build.
    "${PIP[@]}" "torch==$TORCH_VERSION" "infinity-emb[server,torch]==$INFINITY_VERSION" aiohttp "${PINS[@]}"
fi

if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
    echo "error: torchvision is installed in $VENV; remove it (pip uninstall -y torchvision)" >&2
    exit 1
fi

INFINITY_HOME="${INFINITY_HOME:-/tmp/infinity-home}" DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$VENV/bin/python" - <<'EOF'
import importlib.metadata as m

import torch
import transformers
import infinity_emb  # noqa: F401
from transformers import CLIPModel, CLIPProcessor  # noqa: F401

assert torch.__version__.startswith("2.13.0"), torch.__version__
print("ok:", ", ".join(f"{p}=={m.version(p)}" for p in
      ("torch", "transformers", "infinity-emb", "sentence-transformers", "tokenizers", "numpy", "fastapi", "aiohttp")))
EOF
test -x "$VENV/bin/infinity_emb" && echo "ok: $VENV/bin/infinity_emb"
