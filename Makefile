# The README's two commands are `make serve` and `make test`; both install what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXAMPLES := examples/models/mlp/1/model.pt examples/models/lengths/1/model.pt examples/models/sentiment/model.pt \
	examples/models/half_plus_three/123/model.pt

.PHONY: install tools serve lint test examples bench image clean

install: $(VENV)/.installed

# One install command, shared with the Dockerfile: torch is pinned to the CPU build in pyproject.toml.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# wrk, the load generator of bench/ (the test suite runs the benchmarks briefly so they cannot rot).
tools:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)

examples: $(EXAMPLES)

$(EXAMPLES) &: examples/build_models.py $(VENV)/.installed
	$(BIN)/python examples/build_models.py

serve: install examples
	PATH="$(CURDIR)/$(BIN):$$PATH" SERVE_MODEL_ROOT="$${SERVE_MODEL_ROOT:-$(CURDIR)/examples/models}" \
		SERVE_LOAD_MODELS="$${SERVE_LOAD_MODELS-*}" ./serve

lint: install
	$(BIN)/ruff check container tests bench examples

test: install examples tools lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Speed is measured here, never asserted in tests; results go to BENCHMARKS.md.
bench: install tools
	$(BIN)/python -m bench $(SCENARIOS)

image:
	../shared/tools/build-image --run

clean:
	rm -rf $(VENV) $(EXAMPLES)
