# Two entry points that work on a fresh machine: `make demo` and `make test`.
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
	$(BIN)/specfold demo --n 3 --methods vanilla,freedave,spiffy,specfold --rule static
	$(BIN)/specfold demo --n 3 --methods vanilla

test: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests

.PHONY: install demo test
