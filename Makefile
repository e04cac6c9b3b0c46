# The README's two commands are `make serve` and `make test`; both install what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXAMPLES := examples/models/mlp/1/model.pt examples/models/lengths/1/model.pt examples/models/sentiment/model.pt \
	examples/models/half_plus_three/123/model.pt examples/models/mlp_export/1/model.pt2

.PHONY: install lock tools serve lint test examples bench bench-triton bench-perf-analyzer bench-torchserve image clean

install: $(VENV)/.installed

# Installed from the lock with hashes (requirements/install: torch's CPU build from PyTorch's index
# alone), then this project itself, built with the locked setuptools and nothing downloaded. --clear:
# a changed lock gives a fresh environment, with nothing left over from the last one.
$(VENV)/.installed: requirements/test.lock requirements/torch.lock requirements/install pyproject.toml
	$(PYTHON) -m venv --clear $(VENV)
	requirements/install $(VENV) requirements/test.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# Regenerates every lock from pyproject.toml with pip-tools (`make lock LOCK_ARGS=--upgrade` moves
# every pin to the newest allowed release). test.lock is the whole set; server.lock, what the image
# installs, is held to the same pins; server-cuda.lock has PyPI's CUDA torch and its nvidia-* wheels
# (resolved without find-links: a mirror's CPU wheel there would outrank PyPI's CUDA build).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
LOCK_VENV := .lock-venv
COMPILE = $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links --pip-args '--retries 0' $(LOCK_ARGS)

lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet pip-tools==7.6.2
	$(COMPILE) --extra-index-url $(TORCH_INDEX_URL) --extra test -o requirements/test.lock pyproject.toml
	$(COMPILE) --extra-index-url $(TORCH_INDEX_URL) -c requirements/test.lock -o requirements/server.lock pyproject.toml
	awk '/^torch==/ {keep = 1} keep {print; if (!/\\$$/) exit}' requirements/server.lock > requirements/torch.lock
	awk '/^torch==/ {skip = 1} skip {if (!/\\$$/) skip = 0; next} 1' requirements/server.lock > $(LOCK_VENV)/no-torch.txt
	PIP_FIND_LINKS=" " $(COMPILE) -c $(LOCK_VENV)/no-torch.txt -o requirements/server-cuda.lock pyproject.toml

# The load generators of bench/: wrk (HTTP/1.1) and h2load (HTTP/2, for gRPC). The test suite runs the
# benchmarks briefly so they cannot rot.
tools:
	@command -v wrk >/dev/null && command -v h2load >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq wrk nghttp2-client >/dev/null)

examples: $(EXAMPLES)

$(EXAMPLES) &: examples/build_models.py $(VENV)/.installed
	$(BIN)/python examples/build_models.py

serve: install examples
	PATH="$(CURDIR)/$(BIN):$$PATH" SERVE_MODEL_ROOT="$${SERVE_MODEL_ROOT:-$(CURDIR)/examples/models}" \
		SERVE_LOAD_MODELS="$${SERVE_LOAD_MODELS-*}" ./serve

lint: install
	$(BIN)/ruff check container tests bench examples

# The whole suite on two workers (pytest-xdist), a test file to a worker at a time so that a module's
# server starts once, in the order files are collected: the integration files, the longest, first and
# the unit files last to fill the tail. xdist's default order (most tests first) left the bench's one
# two-minute test to the end: 421 s against 347 s. Then test_openapi.py
# alone: schemathesis gives its 52 operations' cases one node id, and xdist would run one of them.
# PYTEST_ARGS (a selection) runs in one process.
test: install examples tools lint
ifeq ($(PYTEST_ARGS),)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --ignore tests/integration/test_openapi.py
	$(BIN)/python -m pytest tests/integration/test_openapi.py
else
	$(BIN)/python -m pytest $(PYTEST_ARGS)
endif

# Speed is measured here, never asserted in tests; results go to BENCHMARKS.md.
bench: install tools
	$(BIN)/python -m bench $(SCENARIOS)

# Triton as the bench's peer (bench/triton.py): nvidia-pytriton's tritonserver and python backend in a
# venv of their own, torch in the same pip command so its CPU wheel is kept. Optional: without it,
# `make bench` leaves Triton's rows out.
TRITON_VENV ?= bench/.triton
bench-triton: install tools
	test -x $(TRITON_VENV)/bin/python || $(BIN)/python -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet nvidia-pytriton==0.7.0 torch==2.13.0

# perf_analyzer, Triton's load generator, for the bench's perf_analyzer scenario: the binary the tritonclient
# 2.41 wheel carries (later wheels carry none), with the CUDA runtime it links from pip and libb64 from the
# machine's apt archive, unpacked beside it (no package is installed). Optional, as Triton is.
PERF_ANALYZER_DIR ?= bench/.perf_analyzer
bench-perf-analyzer: install
	mkdir -p $(PERF_ANALYZER_DIR)/lib $(PERF_ANALYZER_DIR)/downloads
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --dest $(PERF_ANALYZER_DIR)/downloads \
		tritonclient==2.41.0 nvidia-cuda-runtime-cu12==12.9.79
	$(BIN)/python -m bench.perf_analyzer_install $(PERF_ANALYZER_DIR)
	cd $(PERF_ANALYZER_DIR)/downloads && apt-get download libb64-0d && dpkg -x libb64-0d_*.deb libb64
	cp $(PERF_ANALYZER_DIR)/downloads/libb64/usr/lib/*/libb64.so.0d $(PERF_ANALYZER_DIR)/lib/

# SageMaker's PyTorch serving stack for the bench's handler scenario: TorchServe (whose workers import
# yaml without declaring it) and the toolkit's handler service; Java comes from the machine.
TORCHSERVE_VENV ?= bench/.torchserve
bench-torchserve: install
	test -x $(TORCHSERVE_VENV)/bin/python || $(BIN)/python -m venv $(TORCHSERVE_VENV)
	$(TORCHSERVE_VENV)/bin/pip install --quiet torchserve==0.12.0 torch-model-archiver==0.12.0 \
		sagemaker-pytorch-inference==2.0.25 torch==2.13.0 Pillow==13.0.0 PyYAML==6.0.4

# The image, with the Docker engine where one runs, else with buildah (rootless machines, CI without
# Docker). IMAGE_ARGS passes more, e.g. IMAGE_ARGS="--build-arg RUNTIME_IMAGE=nvidia/cuda:…" for the GPU image;
# BUILDAH may carry buildah's global options (BUILDAH="buildah --storage-driver vfs").
IMAGE ?= mmc
BUILDAH ?= buildah
IMAGE_LABELS = --build-arg VERSION=$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) \
	--build-arg REVISION=$$(git rev-parse HEAD) --build-arg SOURCE=$$(git remote get-url origin 2>/dev/null || echo unknown)

image:
	@if docker info >/dev/null 2>&1; then docker build $(IMAGE_LABELS) $(IMAGE_ARGS) -t $(IMAGE) .; \
	elif command -v buildah >/dev/null; then $(BUILDAH) bud --format docker $(IMAGE_LABELS) $(IMAGE_ARGS) -t $(IMAGE) .; \
	else echo "make image needs a Docker engine or buildah" >&2; exit 1; fi

clean:
	rm -rf $(VENV) $(EXAMPLES)
