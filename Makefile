# Two entry points that work on a fresh machine: `make demo` and `make test` (`make test-fast`: its fast tier)
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

# bubblewrap, the code-execution sandbox of the HumanEval/MBPP tests: installed here when it is
# missing and this runs as root with apt; otherwise those tests are skipped, saying how to install it.
sandbox-deps:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "== installing bubblewrap (the code-execution sandbox): apt-get install -y bubblewrap"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }; } || \
	  echo "== could not install bubblewrap: the code-execution tests will be skipped"; \
	else echo "== bubblewrap (bwrap) not found: the code-execution tests will be skipped (install: apt-get install bubblewrap)"; fi

test: $(STAMP) sandbox-deps
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests --durations=20

# the fast tier (a few minutes): the model core, every method's exactness, the engine, the server
# protocol; no Ray, sandbox, training or slow tests (the markers are described in pyproject.toml)
test-fast: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python -m pytest tests -m "not slow and not ray and not sandbox and not train" --durations=10

# torch + `pip install .` alone (no extras) in a fresh temp venv: CLI, README snippet, extra hints
plain-install-check:
	PY=$(PY) bash .ci/plain_install_check.sh

.PHONY: install demo test test-fast sandbox-deps plain-install-check
