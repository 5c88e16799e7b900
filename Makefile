# agentdb - every routine action is a target; `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/agentdb: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

install: $(BIN)/agentdb ## Create .venv and install agentdb with its test and dev tools

test: install ## Run the whole test suite (embedded Postgres unless AGENTDB_TEST_DSN is set)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check agentdb tests
	$(BIN)/ruff format --check agentdb tests
	$(BIN)/mypy

fmt: install ## Format the code with ruff
	$(BIN)/ruff format agentdb tests
	$(BIN)/ruff check --fix agentdb tests

sql: install ## Print the complete DDL (SCHEMA=name to target a schema)
	@$(BIN)/agentdb sql $(if $(SCHEMA),--schema $(SCHEMA))

migrate: install ## Apply migrations to DATABASE_URL
	$(BIN)/agentdb migrate

rollback: install ## Roll back the newest migration on DATABASE_URL
	$(BIN)/agentdb rollback

status: install ## Show migration status of DATABASE_URL
	$(BIN)/agentdb status

ci: lint test ## Everything CI checks

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist

.PHONY: help install test lint fmt sql migrate rollback status ci clean
