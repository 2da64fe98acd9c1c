# `make serve` and `make test` work on a fresh machine with Python 3.11: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Where torch comes from when no local wheel is there. On a GPU machine, e.g.:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu128 serve
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: serve test lint peers

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, CPU-only: PyPI's Linux `torch` is a multi-GB CUDA build. A wheel already on this
	# machine (pip's find-links) is used as is, its dependencies from the usual index; otherwise
	# PyTorch's CPU-only index. GPU: see README.
	$(BIN)/python -c "import torch" 2>/dev/null \
		|| { $(BIN)/pip install --quiet --no-index --no-deps "torch==$(TORCH_VERSION)" 2>/dev/null \
			&& $(BIN)/pip install --quiet "torch==$(TORCH_VERSION)"; } \
		|| $(BIN)/pip install --quiet --index-url $(TORCH_INDEX) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

serve: $(VENV)/.installed
	$(BIN)/mmencode serve

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# vLLM and SGLang as test oracles, in their own venv: --no-deps beside the local CPU torch (never a CUDA
# build), plus only what their decode paths import. Rebuilt only when the pinned list changes.
PEERS_VENV ?= .venv-peers

$(PEERS_VENV)/.installed: tests/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -c "import torch" 2>/dev/null || $(PEERS_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(PEERS_VENV)/bin/pip install --quiet --no-deps -r tests/peers/requirements.txt
	touch $@

peers: $(PEERS_VENV)/.installed

test: lint peers
	@bash .ci/system-deps  # redis-server, haproxy, kubectl: real servers the e2e tests start
	$(BIN)/python -m pytest
