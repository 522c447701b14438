# Two commands on a fresh machine (only Python and pip needed):
#   make demo   -- set up, then run the whole lab on the embedded default (CPU ranks without a GPU)
#   make test   -- set up, then lint, check formatting and run the tests
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (a local file on the project's machines); override to pick another.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.parlab-installed

.PHONY: demo test lint setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/parlab demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: lint
	$(BIN)/pytest

clean:
	rm -rf $(VENV) parlab-results .pytest_cache .ruff_cache
