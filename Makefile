# `make serve` and `make test` work on a fresh machine with Python 3.11: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Where torch comes from when no local wheel is there. On a GPU machine, e.g.:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cu128 serve
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu


# Step3 and Kimi: transformers implements their image processors only with torchvision, which needs
# its own torch. A second environment (local wheels: a CUDA build that runs on the CPU, ~6 GB, ~5 min
# to build), made once and kept; it runs only the tests marked `torchvision`.
TV_VENV ?= .venv-tv
TV_BIN := $(TV_VENV)/bin

.PHONY: serve test lint peers test-torchvision

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

$(TV_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_BIN)/pip install --quiet --upgrade pip
	$(TV_BIN)/pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	# --no-deps: the project's torch range (the main environment's CPU wheel) would replace this torch;
	# pip then warns that mmencode wants torch<2.14, which is this environment's point.
	$(TV_BIN)/pip install --quiet --no-deps -e .
	$(TV_BIN)/python scripts/requirements_without_torch.py > $(TV_VENV)/requirements.txt
	$(TV_BIN)/pip install --quiet -r $(TV_VENV)/requirements.txt
	$(TV_BIN)/python -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1'), torch.__version__"
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
	$(MAKE) test-torchvision

# The Step3 and Kimi tests, which the main environment skips (it has no torchvision).
test-torchvision: $(TV_VENV)/.installed
	$(TV_BIN)/python -m pytest -m torchvision
