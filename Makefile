# agentdb - every routine action is a target; `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --quiet --disable-pip-version-check
PYTEST_ARGS ?=
DEMO_ARGS ?=
CHAOS_ARGS ?=

.DEFAULT_GOAL := help

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.embedded: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[embedded]'
	@touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.embedded

install: $(VENV)/.dev ## Create .venv and install agentdb with its test and dev tools

demo: $(VENV)/.embedded ## Run the crash-tested multi-tenant demo on an embedded Postgres (DEMO_ARGS=...)
	$(BIN)/agentdb demo $(DEMO_ARGS)

chaos: $(VENV)/.embedded ## Crash matrix + soak: >= 1000 SIGKILLs, 0 duplicate effects, 0 lost messages
	$(BIN)/python -m agentdb.chaos $(CHAOS_ARGS)

chaos-quick: $(VENV)/.embedded ## A small crash matrix and soak (CI smoke run)
	$(BIN)/python -m agentdb.chaos --quick $(CHAOS_ARGS)

test: $(VENV)/.dev ## Run the whole test suite (embedded Postgres unless AGENTDB_TEST_DSN is set)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.dev ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check agentdb tests examples
	$(BIN)/ruff format --check agentdb tests examples
	$(BIN)/mypy

fmt: $(VENV)/.dev ## Format the code with ruff
	$(BIN)/ruff format agentdb tests examples
	$(BIN)/ruff check --fix agentdb tests examples

example: $(VENV)/.embedded ## Run examples/quickstart.py on an embedded Postgres
	$(BIN)/python examples/quickstart.py

sql: $(VENV)/.embedded ## Print the complete DDL (SCHEMA=name to target a schema)
	@$(BIN)/agentdb sql $(if $(SCHEMA),--schema $(SCHEMA))

migrate: $(VENV)/.embedded ## Apply migrations to DATABASE_URL
	$(BIN)/agentdb migrate

rollback: $(VENV)/.embedded ## Roll back the newest migration on DATABASE_URL
	$(BIN)/agentdb rollback

status: $(VENV)/.embedded ## Show migration status of DATABASE_URL
	$(BIN)/agentdb status

ci: lint test ## Everything CI checks

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist

.PHONY: help install demo chaos chaos-quick test lint fmt example sql migrate rollback status ci clean
