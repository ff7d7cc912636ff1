# Workload Recovery: `make demo` runs the Console with workers on an embedded default;
# `make test` runs every test against real MariaDB and Redis.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
E2E_STAMP := $(VENV)/.installed-e2e

TEST_DATABASE_URL ?= mysql://root@127.0.0.1:3306/workload_recovery
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1
# `make e2e` uses its own database and Slurm cluster, so it can run beside `make test` and a
# `make slurm-up` cluster.
E2E_DATABASE_URL ?= mysql://root@127.0.0.1:3306/workload_recovery_e2e
E2E_SLURM_DIR ?= var/slurm-e2e
E2E_SLURM_CTLD_PORT ?= 17200
E2E_SLURM_NODE_PORT ?= 17201
E2E_SLURM2411_DIR ?= var/slurm-e2e-24.11
E2E_SLURM2411_CTLD_PORT ?= 17400
E2E_SLURM2411_NODE_PORT ?= 17401
E2E_SLURM2411_SSH_PORT ?= 2400

.PHONY: install install-e2e install-browser install-prometheus install-deploy demo test deploy-check image e2e chaos soak lint format clean bench bench-detect bench-scale bench-ssh bench-console eval-detect fuzz-api slurm-up slurm-down

install: $(STAMP)

$(STAMP): pyproject.toml deploy/dev/system-packages.sh
	deploy/dev/system-packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# torch for the end-to-end scenarios: a separate step, so `make demo` does without it.
install-e2e: $(E2E_STAMP)

$(E2E_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,e2e]'
	touch $(E2E_STAMP)

# Debian's Chromium for the Console's browser tests (Playwright drives it; it never downloads one).
install-browser: install
	deploy/dev/browser-packages.sh

# Debian's prometheus for the metrics connector's tests (started by the tests, never as a service).
install-prometheus: install
	deploy/dev/prometheus-packages.sh

demo: install
	$(BIN)/python manage.py demo

# Tests run in TEST_WORKERS pytest-xdist workers, each with its own test database and Redis
# database; those that share the Slurm clusters, or the Console's browser stack, run in one worker
# (tests/parallel.py). TEST_WORKERS=0 runs them in this process, one after the other. The API fuzz
# test runs after them in a process of its own: Schemathesis gives every operation's test the same
# id, which the workers' scheduler cannot tell apart.
TEST_WORKERS ?= 4
FUZZ_TEST := tests/api/test_fuzz.py

test: install install-e2e install-browser install-prometheus install-deploy
	deploy/dev/ensure-services.sh
	WR_CONTROLLER_PYTHONS=9,13 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	$(BIN)/pytest --numprocesses $(TEST_WORKERS) --durations=20 --ignore=$(FUZZ_TEST)
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest $(FUZZ_TEST)

# The deployment files and the controller's own distribution (the tests marked `deploy`): the
# systemd units (systemd-analyze verify, and each role run under their restrictions), the
# Kubernetes manifests of both overlays (rendered with kubectl kustomize, validated offline
# against the schemas), the image definition (hadolint, shellcheck), and the controller's wheel
# built, installed into a fresh Django-free venv of each Python from 3.9 on, and carrying out a
# restart on the real Slurm clusters. `make test` runs the same tests in its one pytest run (one
# collection, one start of the Slurm clusters), the wheel on Python 3.9 and 3.13 only.
deploy-check: install install-e2e install-deploy
	deploy/dev/ensure-services.sh
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -m deploy

install-deploy: install
	deploy/dev/deploy-packages.sh

# The control plane's image, built with buildah from a debootstrapped Debian 12 base (no registry
# needed; WR_IMAGE_BASE=docker.io/library/debian:bookworm-slim uses one), then its build test.
image: install
	deploy/dev/image-packages.sh build
	deploy/image/build.sh
	deploy/dev/ensure-services.sh
	WR_BUILD_IMAGE=1 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	$(BIN)/pytest tests/deploy/test_image.py -p no:cacheprovider

# Schemathesis over the whole API schema with many examples per operation (`make test` runs the
# same test with a few).
FUZZ_EXAMPLES ?= 200

fuzz-api: install
	deploy/dev/ensure-services.sh
	WR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	$(BIN)/pytest tests/api/test_fuzz.py -p no:cacheprovider

# Fault scenarios injected into real multi-node jobs on a local Slurm cluster; writes
# var/e2e/report.json and prints it as a table checked against the targets.
e2e: install-e2e
	deploy/dev/ensure-services.sh
	rm -f var/e2e/report.json
	status=0; \
	WR_TEST_E2E_SLURM_DIR=$(E2E_SLURM_DIR) WR_TEST_E2E_SLURM_CTLD_PORT=$(E2E_SLURM_CTLD_PORT) \
	WR_TEST_E2E_SLURM_NODE_PORT=$(E2E_SLURM_NODE_PORT) \
	WR_TEST_E2E_SLURM_2411_DIR=$(E2E_SLURM2411_DIR) \
	WR_TEST_E2E_SLURM_2411_CTLD_PORT=$(E2E_SLURM2411_CTLD_PORT) \
	WR_TEST_E2E_SLURM_2411_NODE_PORT=$(E2E_SLURM2411_NODE_PORT) \
	WR_TEST_E2E_SLURM_2411_SSH_PORT=$(E2E_SLURM2411_SSH_PORT) DATABASE_URL=$(E2E_DATABASE_URL) \
	REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest tests/e2e -m e2e || status=$$?; \
	$(BIN)/python tests/e2e/report.py || status=1; \
	exit $$status

# A thousand faults (kills, pauses, database and broker restarts, scheduler outages) against the
# production process layout on a simulated cluster, with a MariaDB and a Redis of its own; writes
# var/chaos/report.json and fails when anything was done twice, lost or left unrecorded.
# `make test` runs the short version (tests/chaos).
CHAOS_SEED ?= 1

chaos: install
	$(BIN)/python -m bench.chaos --seed $(CHAOS_SEED)

# Healthy jobs doing what healthy jobs do (handled tracebacks, warnings, evaluations, long
# checkpoints and stalls, requeues, preemptions, cancels, drains, benign kernel lines) against the
# production process layout on a simulated cluster in acknowledged action mode, with real faults
# at a low rate, and a MariaDB and a Redis of its own; writes var/soak/report.json and fails on any
# action taken on a job or node that had no real fault, or a real fault never acted on.
# SOAK_JOB_HOURS sets the size in simulated job-hours. `make test` runs the short version
# (tests/soak).
SOAK_SEED ?= 1
SOAK_JOB_HOURS ?= 10000

soak: install
	$(BIN)/python -m bench.soak --seed $(SOAK_SEED) --job-hours $(SOAK_JOB_HOURS)

# Benchmarks print their figures next to a reference measured in the same run.
bench: bench-detect bench-scale bench-ssh bench-console

bench-detect: install
	$(BIN)/python -m bench.detect

# Category, attribution, false alarms and cascades over every labelled real log in
# tests/detection/data/, per category with a confusion table; then each prospective round of
# tests/detection/data/rounds/ on its own, before and now; also var/eval/detection.json.
eval-detect: install
	$(BIN)/python -m recovery.detection.evaluation tests/detection/data/*.jsonl \
	    --rounds tests/detection/data/rounds --json var/eval/detection.json

# The whole stack (simulate, a Celery worker, MariaDB, Redis) against a simulated cluster, load
# step by load step; a database and a Redis database of its own, emptied at each step.
SCALE_DATABASE_URL ?= mysql://root@127.0.0.1:3306/workload_recovery_bench
SCALE_REDIS_URL ?= redis://127.0.0.1:6379/3

bench-scale: install
	deploy/dev/ensure-services.sh
	DATABASE_URL=$(SCALE_DATABASE_URL) REDIS_URL=$(SCALE_REDIS_URL) $(BIN)/python -m bench.scale

# A thousand job output files swept over SSH with the batch calls, against the Slurm 24.11 chroot's
# sshd behind a delay of a few ms each way, next to the old one-file-at-a-time reads; writes
# var/bench/ssh.json and the ssh_sweep entry of var/bench/scale.json.
bench-ssh: install
	$(BIN)/python -m bench.ssh_sweep

# The Console at fleet scale: 10,000 workloads and 1,000,000 audit events in a MariaDB database
# of its own (seeded once, kept), served by uvicorn; page server times and live push latency.
CONSOLE_BENCH_DATABASE_URL ?= mysql://root@127.0.0.1:3306/workload_recovery_bench_console
CONSOLE_BENCH_REDIS_URL ?= redis://127.0.0.1:6379/4

bench-console: install install-browser
	deploy/dev/ensure-services.sh
	DATABASE_URL=$(CONSOLE_BENCH_DATABASE_URL) REDIS_URL=$(CONSOLE_BENCH_REDIS_URL) $(BIN)/python -m bench.console

# Settings import against a SQLite file, so lint needs neither MariaDB nor Redis. mypy fails on
# any error not in mypy-baseline and on an entry there that no longer occurs.
LINT_ENV := DATABASE_URL=sqlite:///var/lint.sqlite3

lint: install install-e2e
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(LINT_ENV) $(BIN)/python deploy/dev/mypy_baseline.py
	$(LINT_ENV) $(BIN)/python manage.py check
	$(LINT_ENV) $(BIN)/python manage.py makemigrations --check --dry-run

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf var/staticfiles var/demo

# A four-node Slurm cluster on this machine (as root): 22.05 (the default) in var/slurm-dev, or
# with SLURM=24.11 Debian 13's Slurm in a chroot (var/slurm-trixie-root, built on first use) in
# var/slurm-dev-24.11, reached over its own sshd. slurm-up prints the `export SLURM_CONF=...`
# line (and, for 24.11, the SSH port, key and known_hosts).
SLURM ?= 22.05

slurm-up:
	SLURM_DEV_VERSION=$(SLURM) deploy/slurm-dev/up.sh

slurm-down:
	SLURM_DEV_VERSION=$(SLURM) deploy/slurm-dev/down.sh
