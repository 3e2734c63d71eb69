# Two commands do all set-up on a fresh Linux machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Where there is no GPU, take the CPU build of torch (a plain `pip install torch` pulls CUDA).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

.PHONY: demo test test-fast lint bench claims clean install dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
ifeq ($(HAVE_GPU),yes)
	$(BIN)/pip install -q "torch>=2.9"
else
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" \
	  || $(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX)
endif
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

# the remote-sensing extra (tifffile, spyndex): make claims measures landsat-spectra
$(VENV)/.geo: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e ".[geo]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev

demo: $(VENV)/.installed
	$(BIN)/jimu train

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

# four test processes (pytest-xdist) on two cores: most tests wait on processes they start
# (workers, a Slurm job, a signal), so three kept the cores busy only two thirds of the time
# (vmstat: four, 98%; the suite took 504 s instead of 617 s). The slow tests go first, the
# longest files' first (tests/conftest.py), and a process takes the next test as soon as it
# is done (worksteal). Then the quick claims, alone: one of them is a speed ratio (local
# against plain PyTorch), which another test's workers beside it would move
test: lint
	$(BIN)/python -m pytest -q -n 4 --dist worksteal
	$(BIN)/python benchmarks/claims.py --quick

# the units alone (no test that starts processes or trains whole runs: tests/conftest.py
# fails one that does without the `slow` marker), for the inner loop; `make test` runs all
test-fast: $(VENV)/.dev
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

bench: $(VENV)/.installed
	$(BIN)/jimu bench

# every figure of README.md and BENCHMARKS.md measured again (benchmarks/claims.toml);
# `make test` runs the --quick subset
claims: $(VENV)/.geo
	$(BIN)/python benchmarks/claims.py

clean:
	rm -rf $(VENV) runs bench .pytest_cache .ruff_cache
