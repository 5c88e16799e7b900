"""Mutants of what production conditions need: the pooler switch, interruptible migrations,
refused input, and a worker that never leaves a task running."""

from __future__ import annotations

from agentdb.tools.mutate.catalogue import Mutant, T, m

HOSTILE = T + "test_hostile_input.py"
BOUNCER = T + "test_pgbouncer.py"
MISBEHAVING = T + "test_worker_misbehaving.py"
FINISHING = T + "test_worker_finishing.py"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "worker-retry-cap-ignored",
        "agentdb/worker/finish.py",
        "backoff(task.attempts, base=self.retry_base, cap=self.retry_cap)",
        "backoff(task.attempts, base=self.retry_base)",
        (T + "test_worker.py::test_a_retry_waits_at_most_the_cap",),
        "Finisher: a failed attempt's retry waits the uncapped exponential delay",
    ),
    # ---- the pooler switch ---------------------------------------------------------------
    m(
        "pool-named-statements-behind-a-pooler",
        "agentdb/_db/pool.py",
        '        return {"statement_cache_size": 0}',
        "        return {}",
        (BOUNCER,),
        "create_pool(pooler='transaction') keeps asyncpg's named prepared statements",
    ),
    m(
        "errors-pooler-mismatch-unmapped",
        "agentdb/_db/errormap.py",
        "    if sqlstate in _POOLED:",
        "    if False:",
        (BOUNCER,),
        "error_for: a lost prepared statement is no longer the one line naming the switch",
    ),
    m(
        "migrate-session-search-path",
        "agentdb/migrate.py",
        "SELECT set_config('search_path', %s, true)",
        "SELECT set_config('search_path', %s, false)",
        (T + "test_migrate_pooler.py",),
        "migrations set search_path for the session, on the proxy's shared connection",
    ),
    m(
        "migrate-no-transaction-lock",
        "agentdb/migrate.py",
        "        if locked:\n            _lock(s, session=False)",
        "        if False:\n            _lock(s, session=False)",
        (T + "test_migrate_pooler.py",),
        "a migration's transaction does not take the advisory lock (the only one behind a pooler)",
    ),
    # ---- interruptible migrations ------------------------------------------------------------
    m(
        "migrate-no-recheck-under-the-lock",
        "agentdb/migrate.py",
        '        if (mid in applied) if direction == "apply" else (mid not in applied):\n            return False',
        "        if False:\n            return False",
        (T + "test_migrate_pooler.py", T + "test_migrations.py"),
        "a migration is applied again by a run that waited while another applied it",
    ),
    m(
        "migrate-unrecorded",
        "agentdb/migrate.py",
        '        s.conn.execute(_record(s.schema, mid, direction, f"agentdb {__version__} migrate"))',
        "        pass",
        (T + "test_migrations.py",),
        "a migration commits without its record",
    ),
    # ---- refused input ---------------------------------------------------------------------------
    m(
        "errors-bad-argument-unmapped",
        "agentdb/_db/errormap.py",
        '    "22000": "an argument of the wrong type or encoding",\n',
        "",
        (HOSTILE,),
        "error_for: an argument asyncpg cannot encode (a tenant id that is not a UUID) stays raw",
    ),
    m(
        "jsonb-nul-sent",
        "agentdb/_db/jsonb.py",
        '    if "\\\\u0000" in text and _NUL.search(text):',
        "    if False:",
        (HOSTILE,),
        "document: a NUL character is sent to jsonb instead of refused here",
    ),
    m(
        "jsonb-surrogate-sent",
        "agentdb/_db/jsonb.py",
        '        size = len(text.encode("utf-8"))  # a lone surrogate survives json.dumps, not',
        "        size = len(text)  #",
        (HOSTILE,),
        "document: a lone surrogate is sent to the driver instead of refused here",
    ),
    m(
        "jsonb-cap-bound-compact",
        "agentdb/_db/jsonb.py",
        '    if size + text.count(",") + text.count(":") <= cap:',
        "    if size <= cap:",
        (T + "test_redaction.py",),
        "document: a document under the cap compact but over it as jsonb renders it is sent",
    ),
    m(
        "dsn-unknown-parameters",
        "agentdb/_dsn.py",
        "    if unknown:\n        raise ConfigurationError(",
        "    if False:\n        raise ConfigurationError(",
        (HOSTILE,),
        "DSN: a query parameter asyncpg would send to the server as a setting is accepted",
    ),
    m(
        "dsn-no-database",
        "agentdb/_dsn.py",
        '    if not (parts.path.strip("/") or dict(query).get("dbname")):',
        "    if False:",
        (HOSTILE,),
        "DSN: postgresql:// with no database connects to the OS user's database",
    ),
    m(
        "cli-usage-error-on-two-lines",
        "agentdb/tools/cli.py",
        'f"agentdb: {one_line(message)} (see',
        'f"agentdb: {message} (see',
        (HOSTILE,),
        "CLI: a newline inside an argument splits the usage error over two lines",
    ),
    m(
        "relay-busy-loop",
        "agentdb/relay.py",
        "        if not poll_interval > 0:  # also catches NaN",
        "        if False:",
        (HOSTILE,),
        "Relay accepts a poll interval of 0 (a busy loop against Postgres)",
    ),
    m(
        "relay-sync-publisher",
        "agentdb/relay.py",
        "        if not is_async_callable(publisher):",
        "        if False:",
        (HOSTILE,),
        "Relay accepts a publisher that is not async",
    ),
    m(
        "worker-busy-loop",
        "agentdb/worker/loop.py",
        "        if not value > 0:  # also catches NaN",
        "        if False:",
        (HOSTILE,),
        "Worker accepts a poll interval of 0 (a busy loop against Postgres)",
    ),
    # ---- a worker that never leaves a task running ---------------------------------------------
    m(
        "worker-non-awaitable-retried",
        "agentdb/worker/loop.py",
        "                outcome = Fail(str(exc))",
        "                outcome = Retry(str(exc))",
        (MISBEHAVING,),
        "a handler whose call returned no awaitable is retried (its effects repeated)",
    ),
    m(
        "worker-bad-return-retried",
        "agentdb/worker/outcomes.py",
        '    return Fail(\n        f"handler returned',
        '    return Retry(\n        f"handler returned',
        (MISBEHAVING,),
        "a handler that returned 42 is retried instead of failed",
    ),
    m(
        "worker-refused-outcome-retried",
        "agentdb/worker/finish.py",
        "            await self._record(job, Fail(error), fallback=True)",
        "            await self._record(job, Retry(error), fallback=True)",
        (MISBEHAVING,),
        "an outcome the database refused is retried (and refused again) instead of failed",
    ),
    m(
        "worker-held-never-released",
        "agentdb/worker/loop.py",
        "        await self._finisher.release_held()\n        reason",
        "        reason",
        (FINISHING,),
        "a job whose give-back failed is not released again",
    ),
    m(
        "worker-finishing-write-not-retried",
        "agentdb/worker/finish.py",
        "                if failures >= self.tries:",
        "                if True:",
        (FINISHING,),
        "a finishing write lost with its connection is not retried on a fresh one",
    ),
    # agentdb status: the transaction that holds back cleanup (held snapshots).
    m(
        "status-oldest-any-transaction",
        "agentdb/queries/status.sql",
        "  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)\n",
        "",
        (T + "test_status.py",),
        "status names an open transaction that holds nothing back",
    ),
    m(
        "status-oldest-names-itself",
        "agentdb/queries/status.sql",
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
        "WHERE datname = current_database() AND xact_start IS NOT NULL",
        (T + "test_status.py",),
        "status names its own statement as the oldest open transaction",
    ),
)
