# Two entry points for a fresh clone: `make sweep` and `make test`. Both create or reuse .venv first.
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
CORES ?= 2

.PHONY: setup sweep test lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

sweep: setup
	snakemake --cores $(CORES) --printshellcmds

test: setup
	pytest -q

lint: setup
	ruff check .
