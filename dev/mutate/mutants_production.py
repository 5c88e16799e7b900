"""Mutants of what production conditions need: the pooler switch, interruptible migrations,
refused input, and a worker that never leaves a task running."""

from __future__ import annotations

from dev.mutate.catalogue import Mutant, T, m

HOSTILE = T + "test_hostile_input.py"
BOUNCER = T + "test_pgbouncer.py"
MISBEHAVING = T + "test_worker_misbehaving.py"
FINISHING = T + "test_worker_finishing.py"
CLONES = T + "test_clones.py"
EMBEDDED = T + "test_embedded_cleanup.py"
INSTANTS = HOSTILE + "::test_every_instant_parameter_refuses_what_is_not_an_aware_datetime"

MUTANTS: tuple[Mutant, ...] = (
    # ---- handlers and publishers that misbehave ------------------------------------------
    m(
        "worker-base-exception-escapes",
        "agentdb/worker/loop.py",
        "        raise\n    except BaseException as exc:\n        raise _Escaped(describe(exc)) from exc",
        "        raise",
        (
            MISBEHAVING + "::"
            "test_a_handler_raising_a_base_exception_is_a_failed_attempt_not_the_worker_s_end",
        ),
        "a handler's SystemExit ends the worker's loop; its GeneratorExit leaves the task running",
    ),
    m(
        "describe-str-unguarded",
        "agentdb/_runtime.py",
        '    try:\n        text = str(exc)\n    except Exception:\n        text = "(its str() raised)"',
        "    text = str(exc)",
        (
            MISBEHAVING + "::test_a_handler_exception_whose_str_raises_is_recorded_by_its_type",
            T + "test_relay.py::"
            "test_G10_a_publisher_failing_in_any_way_is_one_failed_publish_and_the_relay_goes_on",
        ),
        "an exception whose str() raises ends the relay / is recorded as a worker failure",
    ),
    m(
        "relay-base-exception-escapes",
        "agentdb/relay.py",
        "        except BaseException as exc:\n            # Any other BaseException",
        "        except Exception as exc:\n            # Any other BaseException",
        (
            T + "test_relay.py::"
            "test_G10_a_publisher_failing_in_any_way_is_one_failed_publish_and_the_relay_goes_on",
        ),
        "a publisher's SystemExit / GeneratorExit ends the relay, the message never recorded",
    ),
    m(
        "relay-publisher-cancel-ends-it",
        "agentdb/relay.py",
        "            if me is not None and me.cancelling():\n                raise  # the relay is",
        "            if True:\n                raise  # the relay is",
        (
            T + "test_relay.py::"
            "test_G10_a_publisher_failing_in_any_way_is_one_failed_publish_and_the_relay_goes_on",
        ),
        "a publisher cancelled by something of its own ends the relay",
    ),
    m(
        "worker-lease-ttl-unbounded",
        "agentdb/worker/loop.py",
        "        if lease_ttl is not None and not _LEASE_MIN <= lease_ttl <= _LEASE_MAX:",
        "        if False:",
        (HOSTILE + "::test_worker_settings_out_of_range_are_refused_when_it_is_made",),
        "Worker(lease_ttl=10 ms): the worker retakes its own task mid-run",
    ),
    m(
        "worker-grace-nan",
        "agentdb/worker/loop.py",
        "        if not shutdown_grace >= 0:",
        "        if shutdown_grace < 0:",
        (HOSTILE + "::test_worker_settings_out_of_range_are_refused_when_it_is_made",),
        "Worker(shutdown_grace=nan): stop() never returns",
    ),
    m(
        "finish-leaves-reservations-reserved",
        "agentdb/worker/finish.py",
        "        if isinstance(outcome, Succeed | Fail):\n            await _unsettled_at_the_end(job)\n",
        "",
        (MISBEHAVING + "::test_a_reservation_left_unsettled_by_a_finished_task_is_marked_unknown",),
        "a task finished with an unsettled reservation leaves it 'reserved' for good",
    ),
    m(
        "relay-publish-uncut",
        "agentdb/relay.py",
        "            async with asyncio.timeout_at(deadline):",
        "            async with asyncio.timeout_at(None):",
        (
            T + "test_relay.py::"
            "test_G10_a_publish_slower_than_the_visibility_is_cut_off_and_recorded",
        ),
        "a publish outlives its claim's visibility: another relay publishes it too, no stop",
    ),
    # ---- refused input -------------------------------------------------------------------
    m(
        "models-long-int-unread",
        "agentdb/models.py",
        "        return json.loads(value, parse_int=Decimal)",
        "        raise",
        (
            T + "test_outbox.py::"
            "test_G10_a_number_python_will_not_read_as_int_does_not_strand_the_batch",
        ),
        "a jsonb integer over 4,300 digits fails every row read with it (a relay's batch)",
    ),
    m(
        "document-keys-not-checked",
        "agentdb/_db/jsonb.py",
        "    if key is not _TEXT:",
        "    if False:",
        (
            HOSTILE
            + "::test_documents_postgres_cannot_store_are_refused_before_anything_is_written",
        ),
        "document(): json.dumps renames a key 1 to '1' ({1: 'a', '1': 'b'} loses 'a')",
    ),
    m(
        "redact-key-coerced",
        "agentdb/redaction.py",
        "                if not isinstance(key, str):",
        "                if False:",
        (
            HOSTILE
            + "::test_documents_postgres_cannot_store_are_refused_before_anything_is_written",
        ),
        "redact(): a key that is not text is passed on (str(None) is 'None')",
    ),
    m(
        "redact-masks-once",
        "agentdb/redaction.py",
        "        for _ in range(_PASSES):",
        "        for _ in range(0):",
        (
            T + "test_redaction.py::"
            "test_G9_secrets_glued_together_are_all_masked_and_the_payload_is_stored",
        ),
        "redact(): a secret glued behind another is left after the first one's mask",
    ),
    m(
        "redact-alternation-only",
        "agentdb/redaction.py",
        "        spans = sorted(m.span() for p in self._each for m in p.finditer(value))",
        "        spans = sorted(m.span() for m in self._values.finditer(value))",
        (
            T + "test_redaction.py::"
            "test_G9_secrets_glued_together_are_all_masked_and_the_payload_is_stored",
        ),
        "redact(): a key running into 'Bearer <token>' swallows the word, leaves the token",
    ),
    m(
        "create-naive-wake-at",
        "agentdb/tasks.py",
        '    aware("wake_at", wake_at)\n    if child_key is not None:',
        "    if child_key is not None:",
        (HOSTILE + "::test_a_naive_wake_at_is_refused_never_read_in_local_time",),
        "tasks.create: a naive wake_at is read in the client's local time zone",
    ),
    m(
        "transition-naive-wake-at",
        "agentdb/tasks.py",
        '    aware("wake_at", wake_at)\n    messages = list(outbox)',
        "    messages = list(outbox)",
        (HOSTILE + "::test_a_naive_wake_at_is_refused_never_read_in_local_time",),
        "tasks.transition: a naive wake_at is read in the client's local time zone",
    ),
    m(
        "release-naive-wake-at",
        "agentdb/leases.py",
        '    aware("wake_at", wake_at)\n\n    params = {',
        "    params = {",
        (HOSTILE + "::test_a_naive_wake_at_is_refused_never_read_in_local_time",),
        "leases.release: a naive wake_at is read in the client's local time zone",
    ),
    m(
        "create-naive-deadline",
        "agentdb/tasks.py",
        '    aware("deadline", deadline)\n',
        "",
        (INSTANTS,),
        "tasks.create: a naive deadline is read in the client's local time zone",
    ),
    m(
        "schedule-naive-start-at",
        "agentdb/schedules.py",
        '    aware("start_at", start_at)\n',
        "",
        (INSTANTS,),
        "schedules.create: a naive start_at is read in the client's local time zone",
    ),
    m(
        "instant-type-unchecked",
        "agentdb/_db/instant.py",
        "    if not isinstance(instant, datetime):\n",
        "    if False:\n",
        (INSTANTS,),
        "an instant that is no datetime fails inside agentdb with an AttributeError",
    ),
    m(
        "claim-task-types-string-read",
        "agentdb/leases.py",
        "    _no_string(task_types)\n",
        "",
        (HOSTILE + "::test_a_string_for_task_types_is_refused_not_read_letter_by_letter",),
        "leases.claim(task_types='send_email') claims types 's', 'e', 'n', ... forever",
    ),
    m(
        "outbox-visibility-unchecked",
        "agentdb/outbox.py",
        "    if visibility <= timedelta(0):",
        "    if False:",
        (HOSTILE + "::test_an_outbox_lease_that_has_already_run_out_is_refused",),
        "outbox.claim leases for a negative visibility: another relay takes the message at once",
    ),
    m(
        "budget-unit-type-unchecked",
        "agentdb/budgets.py",
        "    if not isinstance(unit, str) or _UNIT.fullmatch(unit) is None:\n"
        '        raise ConfigurationError(f"budget unit',
        '    if _UNIT.fullmatch(unit) is None:\n        raise ConfigurationError(f"budget unit',
        (HOSTILE + "::test_a_budget_unit_that_is_not_text_is_a_configuration_error",),
        "set_budget with a unit that is not text raises a bare TypeError",
    ),
    m(
        "transition-outbox-none-payload",
        "agentdb/tasks.py",
        "            {} if m.payload is None else m.payload,",
        "            m.payload,",
        (HOSTILE + "::test_an_outbox_message_with_no_payload_is_an_empty_one",),
        "transition's outbox Message(topic, None) is a raw NOT NULL violation",
    ),
    m(
        "finish-many-outbox-none-payload",
        "agentdb/tasks.py",
        "            body = {} if m.payload is None else m.payload  # as in transition",
        "            body = m.payload",
        (HOSTILE + "::test_an_outbox_message_with_no_payload_is_an_empty_one",),
        "finish_many's outbox Message(topic, None) is a raw NOT NULL violation",
    ),
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
    # The testing kit's clones: each test a fresh copy, made ahead, none left behind.
    m(
        "clones-copy-handed-out-twice",
        "agentdb/testing/_postgres.py",
        "        made = self._made.popleft()\n        self._made.append(",
        "        made = self._made[0]\n        self._made.append(",
        (CLONES,),
        "two tests are handed the same copy of the template",
    ),
    m(
        "clones-failed-copy-not-remade",
        "agentdb/testing/_postgres.py",
        "        except psycopg.Error:\n            # Made while another test ran",
        "        except ValueError:\n            # Made while another test ran",
        (CLONES,),
        "a copy made ahead that failed fails the test that takes it",
    ),
    m(
        "clones-spares-left-behind",
        "agentdb/testing/_postgres.py",
        "                    self.give_back(made.result())",
        "                    made.result()",
        (CLONES,),
        "closing the clones leaves the copies made ahead on the server",
    ),
    m(
        "clones-given-back-kept",
        "agentdb/testing/_postgres.py",
        "self._threads.submit(drop_database, self._server, name)",
        "self._threads.submit(str, name)",
        (CLONES,),
        "a copy given back is never dropped",
    ),
    # Ctrl-C while a command imports: held until the imports are over, then acted on.
    m(
        "entry-ctrl-c-not-held",
        "agentdb/tools/_entry.py",
        "    held = signal.getsignal(signal.SIGINT) is signal.default_int_handler\n",
        "    held = False\n",
        (HOSTILE + "::test_ctrl_c_python_would_swallow_during_an_import_still_ends_the_command",),
        "a Ctrl-C while the CLI is imported raises there, where Python may swallow it",
    ),
    m(
        "cli-ctrl-c-not-held",
        "agentdb/tools/cli.py",
        "        with deferred():\n            parser = build_parser(args_list)",
        "        if True:\n            parser = build_parser(args_list)",
        (HOSTILE + "::test_ctrl_c_python_would_swallow_during_an_import_still_ends_the_command",),
        "a Ctrl-C while the command's tool is imported raises there, where Python may swallow it",
    ),
    m(
        "demo-logs-kept-after-a-clean-run",
        "agentdb/tools/demo/workload.py",
        "    if status == 0:\n        shutil.rmtree(log_path.parent",
        "    if status == 99:\n        shutil.rmtree(log_path.parent",
        (T + "test_relay.py::test_demo_against_a_database_kills_workers_and_loses_nothing",),
        "every demo run leaves its worker and relay logs in the temp folder",
    ),
    m(
        "worker-waits-for-a-handler-ignoring-cancellation",
        "agentdb/tools/processes.py",
        "        if worker.abandoned:\n",
        "        if worker.abandoned and False:\n",
        (
            T + "test_worker.py::test_G12_a_handler_that_ignores_its_cancellation_does_not_keep"
            "_the_worker_from_exiting",
        ),
        "agentdb worker never exits once a handler swallows its cancellation",
    ),
    m(
        "worker-abandoned-not-recorded",
        "agentdb/worker/loop.py",
        "                self.abandoned = tuple(stuck)\n",
        "                self.abandoned = ()\n",
        (
            T + "test_worker.py::test_G12_a_handler_that_ignores_its_cancellation_does_not_keep"
            "_the_worker_from_exiting",
        ),
        "the worker forgets which handlers ignored their cancellation",
    ),
    m(
        "audit-public-policy-reading-no-column-unseen",
        "agentdb/tools/audit/catalog_sql.py",
        "       coalesce(p.polqual::text LIKE '%%{VAR %%', false)\n",
        "       coalesce(pg_get_expr(p.polqual, p.polrelid) <> 'true', false)\n",
        (
            T + "test_audit.py::test_G15_policy_opening_every_row_to_public_is_flagged",
            T + "test_audit.py::test_G15_a_public_policy_that_reads_the_tenant_column_is_not"
            "_flagged",
        ),
        "agentdb audit: a PUBLIC policy USING (1 = 1) passes as tenant scoping",
    ),
    # A second Ctrl-C landing before the embedded server's cleanup holds signals.
    m(
        "embedded-cleanup-cut-by-a-second-signal",
        "agentdb/tools/embedded.py",
        "            came = came or exc\n",
        "            raise\n",
        (EMBEDDED + "::test_a_signal_before_the_cleanup_holds_signals_restarts_it_and_still_acts",),
        "a Ctrl-C before the cleanup holds signals leaves the server's directory behind",
    ),
    m(
        "embedded-cleanup-swallows-the-signal",
        "agentdb/tools/embedded.py",
        "    if came is not None:\n        raise came\n",
        "    if came is not None and not done:\n        raise came\n",
        (EMBEDDED + "::test_a_signal_before_the_cleanup_holds_signals_restarts_it_and_still_acts",),
        "a Ctrl-C that restarted the cleanup is swallowed: the process carries on",
    ),
    m(
        "loop-made-with-ctrl-c-unheld",
        "agentdb/tools/_signals.py",
        "            with deferred():\n                runner = stack.enter_context",
        "            if True:\n                runner = stack.enter_context",
        (HOSTILE + "::test_ctrl_c_while_the_event_loop_is_being_made_is_one_line",),
        "a Ctrl-C inside the loop's constructor leaves a half-made loop that prints a traceback",
    ),
)
