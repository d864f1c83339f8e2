# Two commands: `make demo` and `make test`. Both do the whole set-up first (idempotent):
# virtual environment with the pinned packages, the embedded PostgreSQL with the schema, the Spark
# class-data sharing archive, and Airflow's metadata database. The warm Spark Connect server starts
# on first use; `make stop` stops it and PostgreSQL.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
CHROMIUM := /usr/bin/chromium
APT_INSTALL = if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $(1); \
	 else sudo apt-get update -q && sudo apt-get install -y -q $(1); fi
# The checkout's state folder and config file (an installed redelivery defaults to ~/.redelivery and
# the defaults of redelivery.config); every command below and every process it starts reads them.
export REDELIVERY_HOME ?= $(CURDIR)/.redelivery
export REDELIVERY_CONFIG ?= $(CURDIR)/config/redelivery.yaml
AIRFLOW_ENV = eval "$$($(VENV)/bin/redelivery airflow-env)"

.PHONY: setup demo test lint docs docs-reference bench bench-publish bench-receive bench-claim bench-drain bench-ordered bench-airflow soak-airflow live-bench chaos clean stop lock

setup: $(VENV)/.installed $(CHROMIUM)
	$(VENV)/bin/redelivery db upgrade
	$(VENV)/bin/redelivery spark-cds
	@$(AIRFLOW_ENV) && $(VENV)/bin/airflow db migrate > .redelivery/airflow-db-migrate.log 2>&1 \
	  || { tail -30 .redelivery/airflow-db-migrate.log; exit 1; }
	@echo "set-up done"

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv==0.13.8
	# the bytecode now, once (about 20 s): where PYTHONDONTWRITEBYTECODE is set, as on this project's
	# machines, every process would otherwise compile what it imports, each time (Airflow's import
	# 4.5 s instead of 2.4 s, in every component, task and CLI call)
	$(UV) pip sync --python $(PY) --compile-bytecode requirements.txt
	$(UV) pip install --python $(PY) --no-deps -e .
	# PyPI has PySpark only as a source archive: every online install keeps a new ~2 GB build of it
	# in uv's cache, and nothing removes the older ones; a run of CI filled the disk that way
	timeout 300 $(UV) cache prune --quiet || echo "uv cache prune failed or waited too long: ignored"
	# setuptools leaves src/redelivery.egg-info behind; src/ is on sys.path (editable), so Airflow
	# would find the distribution, its provider and its plugin twice
	rm -rf src/*.egg-info
	touch $@

# Debian's Chromium for the operator UI tests (Playwright drives it; no browser download).
$(CHROMIUM):
	@$(call APT_INSTALL,chromium)

demo: setup
	@$(AIRFLOW_ENV) && $(PY) -m demo $(DEMO_ARGS)

# Two pytest-xdist workers: the suite waits on servers half the time (tests/conftest.py gives each
# worker its own databases on the embedded server); one process against an external
# REDELIVERY_TEST_DATABASE_URL, or a store of the user's (REDELIVERY_DATABASE_URL: its Airflow
# metadata database is the user's too, one for both workers).
PYTEST_WORKERS ?= $(if $(REDELIVERY_TEST_DATABASE_URL)$(REDELIVERY_DATABASE_URL),0,2)
test: setup lint
	@$(AIRFLOW_ENV) && $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# ruff (configured in pyproject.toml): lint rules and formatting, as CI runs them.
LINTED := src dags plugins spark_jobs tests bench chaos demo harness docs/hooks.py
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# The documentation site (mkdocs.yml): README.md as its home page and the pages of docs/, built
# into site/ (not committed) with --strict: a link to a page or an anchor that does not exist fails.
# The configuration reference is written from the code first. `make test` checks both
# (tests/system/test_docs.py).
docs: docs-reference
	$(VENV)/bin/mkdocs build --strict

# docs/configuration.md's tables, from the models of redelivery.settings and redelivery.config;
# docs/statements.sql, every statement whole.
docs-reference: $(VENV)/.installed
	$(PY) -m redelivery.reference docs/configuration.md
	$(VENV)/bin/redelivery db sql > docs/statements.sql

bench: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_tier.py $(BENCH_ARGS)

bench-publish: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_publish.py $(BENCH_ARGS)

bench-receive: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_receive.py $(BENCH_ARGS)

# Claim latency at fixed offered rates, the peak and churn under a held horizon, against PGMQ (issue 42).
bench-claim: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_claim.py $(BENCH_ARGS)

# A million messages drained in production conditions, against PGMQ and the plain queue (issue 29).
bench-drain: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_drain.py $(BENCH_ARGS)

# An ordered subscription against an unordered one, and a blocked hot key's cost (issue 31).
bench-ordered: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_ordered.py $(BENCH_ARGS)

# What the tiers cost a real Airflow per day: a DAG run per window against batched runs (issue 38).
bench-airflow: setup
	@$(AIRFLOW_ENV) && $(PY) bench/bench_airflow.py $(BENCH_ARGS)

# The Airflow side in compressed time: runs, task instances and task logs flat past their retention.
soak-airflow: setup
	@$(AIRFLOW_ENV) && $(PY) bench/soak_airflow.py $(BENCH_ARGS)

# Retries' lateness under a real Airflow scheduler, three ways (spark-submit, Connect, auto).
live-bench: setup
	@$(AIRFLOW_ENV) && $(PY) -m bench.live_lateness $(BENCH_ARGS)

# The crash suite: real processes killed at 1000 known points, the invariants checked after each
# round (chaos/run.py; KILL_POINTS=... to change the count).
KILL_POINTS ?= 1000
chaos: setup
	@$(AIRFLOW_ENV) && $(PY) chaos/run.py --kill-points $(KILL_POINTS) --every-kind $(CHAOS_ARGS)

# Recompile the pinned requirements from requirements.in.
lock:
	$(UV) pip compile requirements.in --excludes excludes.txt -o requirements.txt --python-version 3.11

stop:
	-$(VENV)/bin/redelivery spark-connect stop
	-$(VENV)/bin/redelivery db stop

clean: stop
	rm -rf .redelivery demo-output
