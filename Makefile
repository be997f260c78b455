# Two commands on a fresh machine: `make test` (the CPU tier) and `make demo` (every capstone at
# the size this hardware allows). Both create .venv and install everything first.
#
# On a machine that already has the packages (a GPU runner's image, say), point PYTHON at its
# interpreter and set-up is skipped:  make gpu-test PYTHON=python3

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV       ?= .venv
VENV_PY    := $(VENV)/bin/python
PYTHON     ?= $(VENV_PY)
BOOTSTRAP  ?= python3
STAMP      := $(VENV)/.installed
EXTRAS     ?= dev
# Extras the CPU tier tests when they install; where one cannot install, set-up carries on and
# its tests skip with the reason.
OPTIONAL_EXTRAS ?= ray deepspeed dali fp8 structured
PYTEST_ARGS ?=
APPLE_TESTS ?= 1

# torch: a machine with an NVIDIA driver takes the usual PyPI build (CUDA); a machine without one
# takes the release the CPU tier is tested on. Override with e.g. `make setup TORCH_SPEC=torch==2.9.1`.
HAS_NVIDIA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_NVIDIA),1)
TORCH_SPEC ?= torch>=2.6
else
TORCH_SPEC ?= torch==2.13.0
endif

# Set-up runs only when PYTHON is the project's own virtual environment.
ifeq ($(PYTHON),$(VENV_PY))
SETUP := setup
else
SETUP :=
endif

export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: help setup test test-all gpu-test demo publish project01 project02 project03 project04 apple apple-test apple-tier lint format fork clean readme

help:  ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv and install the project with its dev tools (fast when done)

$(STAMP): pyproject.toml
	@test -x $(VENV_PY) || $(BOOTSTRAP) -m venv $(VENV)
	$(VENV_PY) -m pip install -q --upgrade pip
	$(VENV_PY) -m pip install -q "$(TORCH_SPEC)"
	$(VENV_PY) -m pip install -q -e ".[$(EXTRAS)]"
	@for x in $(OPTIONAL_EXTRAS); do \
	  if $(VENV_PY) -m pip install -q -e ".[$$x]" >$(VENV)/.extra-$$x.log 2>&1; \
	  then echo "optional extra '$$x': installed"; \
	  else echo "optional extra '$$x': could not install here (see $(VENV)/.extra-$$x.log); its tests will skip"; fi; \
	done
	@touch $(STAMP)

# The CPU tier comes in two sizes. `make test` is the fast one a contributor runs before every
# commit: every test not marked `slow` or `gpu`, spread over the machine's cores by pytest-xdist
# (minutes on two cores). `make test-all` is everything that needs no GPU: the fast tier plus
# the `slow` tests (real torchrun jobs, kill -9 trials, nvcc builds, Ray Tune, forks running their
# own suites, the exporters); CI (`.ci/run`) runs it.
# PYTEST_WORKERS=0 runs in one process; files stay whole on one worker (--dist loadfile), so a
# module's fixtures are built once.
PYTEST_WORKERS ?= auto
# (expanded when the recipe runs, after set-up; without pytest-xdist the tests run in one process)
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,$(shell $(PYTHON) -c 'import xdist' 2>/dev/null && echo --numprocesses=$(PYTEST_WORKERS) --dist=loadfile))

test: $(SETUP)  ## the fast CPU tier: every test not marked slow or gpu (minutes)
	$(PYTHON) -m pytest -m "not gpu and not slow" $(XDIST) $(PYTEST_ARGS)

test-all: $(SETUP)  ## everything that needs no GPU: the fast tier, the slow tests, the on-device track (what CI runs)
	$(PYTHON) -m pytest -m "not gpu" $(XDIST) $(PYTEST_ARGS)
ifneq ($(wildcard apple_track/Makefile),)
ifeq ($(APPLE_TESTS),1)
	@$(MAKE) --no-print-directory apple-tier
endif
endif

# The on-device track's exporters (litert-torch pins its own torch) live in .venv-apple.
# `make test-all` sets it up when this machine can (about 7 GB of disk, a few minutes the first
# time) and runs the track's tests there; where it cannot, it says so in one line. APPLE_TESTS=0
# leaves it out.
apple-tier:
	@free_gb=$$(df -Pk . | awk 'NR==2 {print int($$4/1048576)}'); \
	if [ "$$free_gb" -lt 12 ]; then \
	  echo "apple_track: not tested: $$free_gb GB free here, its environment needs about 8"; exit 0; fi; \
	mkdir -p .scratch; \
	if $(MAKE) --no-print-directory -f apple_track/Makefile setup > .scratch/apple-setup.log 2>&1; then \
	  $(MAKE) --no-print-directory -f apple_track/Makefile test PYTEST_ARGS="-q"; \
	else echo "apple_track: its environment could not be set up here (.scratch/apple-setup.log): its Core ML / LiteRT / MLX tests did not run"; fi

gpu-test: $(SETUP)  ## the GPU tier (on a CUDA machine)
	$(PYTHON) -m pytest -m gpu $(PYTEST_ARGS)

.PHONY: gpu-smoke cuda-compile cuda-compile-bindings

# The GPU smoke tier: the CUDA extensions built, then the GPU tests marked `smoke`; prints what
# it skipped and why, writes runs/gpu-smoke/ (junit.xml, summary.json). The CI runner passes
# GPU_SMOKE_ARGS=--require-gpu, so that a machine whose GPU is not usable fails instead of skipping.
GPU_SMOKE_ARGS ?=

gpu-smoke: $(SETUP)  ## the GPU smoke tests, any CUDA extensions built first (minutes on one GPU)
	$(PYTHON) -m scripts.gpu_smoke $(GPU_SMOKE_ARGS)

# Re-measure the headline figures on this GPU at reduced size and compare them with reports/:
# exit 0 all agree, 1 a disagreement, 3 no GPU, 4 some not checkable here (each said why).
# e.g. VERIFY_ARGS="--only p04" (one project's figures), or --list.
VERIFY_ARGS ?=
.PHONY: verify-results

verify-results: $(SETUP)  ## re-measure the headline figures on this GPU, compare with reports/
	$(PYTHON) -m scripts.verify_results $(VERIFY_ARGS)

# e.g. CUDA_COMPILE_ARGS=--strict (as CI: no nvcc is a failure, not a skip), or --arch 80
CUDA_COMPILE_ARGS ?=
cuda-compile:  ## compile every CUDA source for sm_90a with nvcc alone (no GPU, no torch)
	$(BOOTSTRAP) scripts/compile_cuda.py $(CUDA_COMPILE_ARGS)

# The torch bindings (csrc/*.cpp, and the .cu files holding TORCH_EXTENSION_NAME) compiled against
# $(PYTHON)'s torch, whose CPU build ships the CUDA headers, with the kernel sources beside them;
# each launcher a binding calls must be defined with the same signature. Takes CUDA_COMPILE_ARGS
# too; minutes on a 2-core machine (torch's headers are heavy).
cuda-compile-bindings: $(SETUP)  ## the torch bindings against torch's headers, their launchers checked (no GPU)
	$(PYTHON) scripts/compile_cuda.py --bindings $(CUDA_COMPILE_ARGS)

demo: $(SETUP)  ## every capstone at the size this hardware allows, into runs/<UTC time>/
	$(PYTHON) -m scripts.demo

publish: $(SETUP)  ## make publish RUN=runs/<time>: a run becomes reports/ and the README results
	@test -n "$(RUN)" || { echo "usage: make publish RUN=runs/<time> (the folder make demo printed)"; exit 2; }
	$(PYTHON) -m scripts.publish $(RUN)

project01: $(SETUP)  ## build, test, benchmark and profile the CUDA kernels (needs a GPU)
	$(PYTHON) -m scripts.demo --only project01

project02: $(SETUP)  ## FSDP strong-scaling benchmark (GPUs, or 2 gloo processes on CPU)
	$(PYTHON) -m scripts.demo --only project02

project03: $(SETUP)  ## fault-tolerant training under injected failures
	$(PYTHON) -m scripts.demo --only project03

# project04's benchmarks write to a run folder (never to reports/); publish by copying it there.
# expanded once (:=), so every step of the target writes into the same folder
ifndef P04_RUN
P04_RUN := runs/project04-$(shell date -u +%Y%m%dT%H%M%S)
endif
P04_BENCHES ?= decode-kernel gemv-kernel prefill-kernel latency throughput memory prefix

project04: $(SETUP)  ## build, test, benchmark and report the inference engine (needs a GPU)
	@if ! $(PYTHON) -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then \
	  for s in "GPU tests" $(P04_BENCHES) serving spec-train spec report; do \
	    echo "project04 $$s: skipped: needs a CUDA GPU (torch sees none)"; done; exit 0; fi; \
	set -e; \
	$(PYTHON) -m pytest -m gpu tests/project04_llm_inference -q; \
	for b in $(P04_BENCHES); do echo "== project04 $$b"; \
	  $(PYTHON) -m project04_llm_inference $$b --reports-dir $(P04_RUN); done; \
	echo "== project04 serving (a server launched on 127.0.0.1, a rate sweep)"; \
	$(PYTHON) -m project04_llm_inference serving --launch --engine.load-format dummy \
	  --engine.dummy-shape llama-3.2-1b --request-rates 8 16 32 inf --num-prompts 300 \
	  --offline-record $(P04_RUN)/project04_llm_inference/offline_throughput.json \
	  --reports-dir $(P04_RUN) --no-progress; \
	echo "== project04 speculative decoding (trains a target and a draft, then times them)"; \
	$(PYTHON) -m project04_llm_inference.spec.train_corpus --models-dir $(P04_RUN)/spec-models --distill 1.0 \
	  --max-steps 1500 --target-dim 1024 --target-layers 16 --target-heads 16 --target-ffn 2816; \
	$(PYTHON) -m project04_llm_inference spec --models-dir $(P04_RUN)/spec-models --num-prompts 16 --repeats 3 \
	  --reports-dir $(P04_RUN); \
	$(PYTHON) -m project04_llm_inference report --reports-dir $(P04_RUN); \
	echo "project04: results in $(P04_RUN)"

apple: $(SETUP)  ## the on-device track, in its own environment (.venv-apple)
	$(PYTHON) -m scripts.demo --only apple

apple-test:  ## the on-device track's full tests in .venv-apple (~7 GB, a few minutes to set up)
	$(MAKE) -f apple_track/Makefile test

lint: $(SETUP)  ## ruff
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format: $(SETUP)  ## ruff format + autofix
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

readme: $(SETUP)  ## refresh the README result tables from reports/
	$(PYTHON) -m scripts.refresh_readme

fork: $(SETUP)  ## make fork PROJECT=project01_cuda_kernel DEST=../my-kernels
	@test -n "$(PROJECT)" -a -n "$(DEST)" || { echo "usage: make fork PROJECT=<project folder> DEST=<new directory>"; exit 2; }
	$(PYTHON) -m scripts.fork_project $(PROJECT) $(DEST)

clean:  ## remove build outputs (keeps .venv and reports/)
	rm -rf .build .pytest_cache .ruff_cache .scratch
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
