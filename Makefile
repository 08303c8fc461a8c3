# Two entry points that work on a fresh machine: `make demo` and `make test`
# (and `make plain-install-check`, which CI runs after `make test`).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev,eval,serve,triton,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@echo "== 1. every method under the tiny model's own rule (confidence threshold 0.9 in sub-blocks):"
	@echo "==    FreeDave and Spiffy give vanilla's tokens in fewer forwards; SpecFold folds their"
	@echo "==    verification (delta 0.05: approximate, exact at delta 0)"
	$(BIN)/specfold demo --n 3 --methods vanilla,freedave,spiffy,specfold
	@echo "== 2. the same under the static rule (one token per step), where drafts save the most forwards"
	$(BIN)/specfold demo --n 3 --methods vanilla,freedave,spiffy,specfold --rule static

test: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests

# torch + `pip install .` alone (no extras) in a fresh temp venv: CLI, README snippet, extra hints
plain-install-check:
	PY=$(PY) bash .ci/plain_install_check.sh

.PHONY: install demo test plain-install-check
