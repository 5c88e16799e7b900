# agentdb - every routine action is a target; `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --quiet --disable-pip-version-check
PYTEST_ARGS ?=
DEMO_ARGS ?=
CHAOS_ARGS ?=
BENCH_ARGS ?=
MUTATE_ARGS ?=
# make mutate-sample: how many generated mutants, and the seed that picks them.
N ?= 100
SEED ?= 1
# make mutate-python: the library modules mutmut mutates.
MODULES ?= agentdb/redaction.py

.DEFAULT_GOAL := help

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The console too: `make demo DEMO_ARGS=--console` leaves it up after the report.
$(VENV)/.embedded: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[embedded,console]'
	@touch $@

$(VENV)/.bench: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[bench]'
	@touch $@ $(VENV)/.embedded

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.embedded

install: $(VENV)/.dev ## Create .venv and install agentdb with its test and dev tools

demo: $(VENV)/.embedded ## Run the crash-tested multi-tenant demo on an embedded Postgres (DEMO_ARGS=..., --console: then the console)
	$(BIN)/agentdb demo $(DEMO_ARGS)

chaos: $(VENV)/.embedded ## Crash matrix + soak: >= 1000 SIGKILLs, 0 duplicate effects, 0 unjustified replays, 0 lost messages
	$(BIN)/python -m agentdb.tools.chaos $(CHAOS_ARGS)

chaos-quick: $(VENV)/.embedded ## A small crash matrix and soak (CI smoke run)
	$(BIN)/python -m agentdb.tools.chaos --quick $(CHAOS_ARGS)

bench: $(VENV)/.bench ## agentdb vs raw asyncpg, PgQueuer, Procrastinate; report in bench-results/ (BENCH_ARGS=...)
	$(BIN)/agentdb bench $(BENCH_ARGS)

bench-quick: $(VENV)/.bench ## The same at small sizes, under a minute (CI smoke run)
	$(BIN)/agentdb bench --quick $(BENCH_ARGS)

test: $(VENV)/.dev ## Run the whole test suite (embedded Postgres unless AGENTDB_TEST_DSN is set)
	$(BIN)/pytest $(PYTEST_ARGS)

# The files make test-server leaves out: what does not depend on the server's
# version - the benchmark, the wheel, the docs site, the browser, the embedded
# server's own cleanup, the agent frameworks' crash and install runs. make test
# runs them; CI runs make test on the embedded PostgreSQL (16) and this on the
# machine's own (15).
SERVER_AGNOSTIC ?= tests/test_bench.py tests/test_wheel.py tests/test_docs.py \
	tests/test_console_browser.py tests/test_embedded_cleanup.py \
	tests/integrations/test_openai_agents_crash.py tests/integrations/test_pydantic_ai_crash.py \
	tests/integrations/test_mcp_crash.py tests/integrations/test_extras.py

test-server: $(VENV)/.dev ## make test on AGENTDB_TEST_DSN's server, less the files that do not depend on its version
	@test -n "$$AGENTDB_TEST_DSN" || { echo "make test-server: set AGENTDB_TEST_DSN to a database on the server to test (make test needs none)" >&2; exit 2; }
	$(BIN)/pytest $(addprefix --ignore=,$(SERVER_AGNOSTIC)) $(PYTEST_ARGS)

# The suites make test-citus runs a second time with every test database on
# the cluster: raw-SQL attacks, runtime, worker, relay, crash and model tests.
CITUS_SUITES ?= tests/test_attacks.py tests/test_fences.py tests/test_tenant_isolation.py \
	tests/test_tasks.py tests/test_leases.py tests/test_operations.py tests/test_outbox.py \
	tests/test_complete_many.py tests/test_tenancy.py tests/test_tenant_deletion.py \
	tests/test_retention.py tests/test_fairness.py tests/test_status.py tests/test_worker.py \
	tests/test_worker_finishing.py tests/test_worker_misbehaving.py tests/test_relay.py \
	tests/test_crash.py tests/test_model.py tests/test_cancel.py tests/test_deadlines.py \
	tests/test_signals.py tests/test_children.py tests/test_schedules.py tests/test_budgets.py \
	tests/test_durable.py tests/test_operator.py

# The suites make test-events-by-month runs a second time with every test
# database's agent_events partitioned by month (the opt-in layout: --events-by-month).
BY_MONTH_SUITES ?= tests/test_attacks.py tests/test_events_diet.py tests/test_tasks.py \
	tests/test_operations.py tests/test_retention.py tests/test_tenant_deletion.py \
	tests/test_signals.py tests/test_children.py tests/test_fairness.py tests/test_model.py \
	tests/test_durable.py tests/test_operator.py

test-events-by-month: $(VENV)/.dev ## Attacks, runtime, retention and model suites with agent_events partitioned by month (--events-by-month)
	AGENTDB_TEST_EVENTS_BY_MONTH=1 $(BIN)/pytest $(BY_MONTH_SUITES) $(PYTEST_ARGS)

test-citus: $(VENV)/.dev ## Citus tests + attacks/runtime/worker/relay/crash/model suites + chaos-quick on AGENTDB_CITUS_DSN (not in make test)
	@test -n "$$AGENTDB_CITUS_DSN" || { echo "make test-citus: set AGENTDB_CITUS_DSN to a database on a Citus coordinator (citus installed, workers added); see docs/deploy/citus.md" >&2; exit 2; }
	$(BIN)/pytest tests/citus $(PYTEST_ARGS)
	AGENTDB_TEST_ON_CITUS=1 $(BIN)/pytest $(CITUS_SUITES) $(PYTEST_ARGS)

lint: $(VENV)/.dev ## ruff (lint + format check), mypy --strict, the import contracts, the generated docs
	$(BIN)/ruff check agentdb tests examples dev
	$(BIN)/ruff format --check agentdb tests examples dev
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m dev.docs --check

mutate: $(VENV)/.dev ## Mutation check: >= 80 mutants of the guards, each must fail its tests (MUTATE_ARGS=...)
	$(BIN)/python -m dev.mutate $(MUTATE_ARGS)

mutate-citus: $(VENV)/.dev ## The mutants of the Citus statements, their tests run on AGENTDB_CITUS_DSN
	$(BIN)/python -m dev.mutate --citus $(MUTATE_ARGS)

mutate-generated: $(VENV)/.dev ## Every mechanical SQL mutant from the parse tree (dev/mutate/generate.py; long: use mutate-sample)
	$(BIN)/python -m dev.mutate --generated $(MUTATE_ARGS)

mutate-python: $(VENV)/.dev ## mutmut's mutants of library modules (MODULES="agentdb/redaction.py ..."; dev/mutate/python.py)
	$(BIN)/python -m dev.mutate.python $(MODULES) $(MUTATE_ARGS)

mutate-ci: $(VENV)/.dev ## CI's mutation gate: the seeded sample of 100 generated mutants (seed 1), killers first
	$(BIN)/python -m dev.mutate --generated --sample 100 --seed 1 --jobs 1 --timeout 90 $(MUTATE_ARGS)

mutate-sample: $(VENV)/.dev ## A seeded sample of the generated SQL mutants (N=100, SEED=1; MUTATE_ARGS=--jobs 1 ...)
	$(BIN)/python -m dev.mutate --generated --sample $(N) --seed $(SEED) $(MUTATE_ARGS)

readme: $(VENV)/.dev ## Regenerate the guarantee tables, the CLI and errors pages (dev/docs.py)
	$(BIN)/python -m dev.docs --write

docs: $(VENV)/.dev ## Serve the docs site at http://127.0.0.1:8000/ (mkdocs.yml)
	$(BIN)/mkdocs serve

docs-build: $(VENV)/.dev ## Build the docs site into site/ (--strict: a broken link or anchor fails)
	$(BIN)/python -m dev.docs --check
	$(BIN)/mkdocs build --strict

fmt: $(VENV)/.dev ## Format the code with ruff
	$(BIN)/ruff format agentdb tests examples dev
	$(BIN)/ruff check --fix agentdb tests examples dev

example: $(VENV)/.embedded ## Run examples/quickstart.py on an embedded Postgres
	$(BIN)/python examples/quickstart.py

schema: $(VENV)/.embedded ## Rewrite sql/schema.sql from a freshly migrated database (AGENTDB_TEST_DSN, else embedded)
	$(BIN)/python -m dev.schema_state write

sql: $(VENV)/.embedded ## Print the complete DDL (SCHEMA=name to target a schema)
	@$(BIN)/agentdb sql $(if $(SCHEMA),--schema $(SCHEMA))

migrate: $(VENV)/.embedded ## Apply migrations to DATABASE_URL
	$(BIN)/agentdb migrate

rollback: $(VENV)/.embedded ## Roll back the newest migration on DATABASE_URL
	$(BIN)/agentdb rollback

status: $(VENV)/.embedded ## Operator status of DATABASE_URL (tasks, leases, outbox, purge backlog)
	$(BIN)/agentdb status

audit: $(VENV)/.embedded ## Which of the guarantees (agentdb/guarantees.py) the schema at DATABASE_URL enforces
	$(BIN)/agentdb audit

purge: $(VENV)/.embedded ## Delete what is past retention at DATABASE_URL, in small batches
	$(BIN)/agentdb purge

ci: lint test chaos-quick ## What .ci/run checks (it also runs the suite on AGENTDB_TEST_DSN)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis build dist mutation-results site

.PHONY: help install demo chaos chaos-quick bench bench-quick test test-server test-events-by-month test-citus lint mutate mutate-citus mutate-generated mutate-python mutate-sample mutate-ci readme docs docs-build fmt example schema sql migrate rollback status audit purge ci clean
