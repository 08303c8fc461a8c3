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
	$(BIN)/pip install -q -e ".[dev,eval,serve,triton]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@echo "== 1. every method under the static rule (one token per step): drafts are accepted, so"
	@echo "==    the speculative methods need fewer forwards than vanilla for the same tokens"
	$(BIN)/specfold demo --n 3 --methods vanilla,freedave,spiffy,specfold --rule static
	@echo "== 2. vanilla under the tiny model's own rule (confidence threshold: several tokens per"
	@echo "==    forward already, so it is not comparable with the one-token-per-step runs above)"
	$(BIN)/specfold demo --n 3 --methods vanilla

test: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests

# torch + `pip install .` alone (no extras) in a fresh temp venv: CLI, README snippet, extra hints
plain-install-check:
	PY=$(PY) bash .ci/plain_install_check.sh

.PHONY: install demo test plain-install-check
