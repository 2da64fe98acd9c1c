# `make serve` and `make test` work on a fresh machine with Python 3.11: they build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve test lint

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The local CPU wheel: a bare `torch` from the index would be a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

serve: $(VENV)/.installed
	$(BIN)/mmencode serve

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	@bash .ci/system-deps  # redis-server, haproxy, kubectl: real servers the e2e tests start
	$(BIN)/python -m pytest
