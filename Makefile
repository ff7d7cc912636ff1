# Workload Recovery: `make demo` runs the Console with workers on an embedded default;
# `make test` runs every test against real MariaDB and Redis.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

TEST_DATABASE_URL ?= mysql://root@127.0.0.1:3306/workload_recovery
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1

.PHONY: install demo test lint format clean bench bench-detect slurm-up slurm-down

install: $(STAMP)

$(STAMP): pyproject.toml deploy/dev/system-packages.sh
	deploy/dev/system-packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/python manage.py demo

test: install
	deploy/dev/ensure-services.sh
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest

# Benchmarks print their figures next to a reference measured in the same run.
bench: bench-detect

bench-detect: install
	$(BIN)/python -m bench.detect

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf var/staticfiles var/demo

# A four-node Slurm 22.05 cluster on this machine (as root) in var/slurm-dev. slurm-up prints
# the `export SLURM_CONF=...` line that points sbatch, squeue and scontrol at it.
slurm-up:
	deploy/slurm-dev/up.sh

slurm-down:
	deploy/slurm-dev/down.sh
