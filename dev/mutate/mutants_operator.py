"""Mutants of the operator's features (0013.operator, issue 39): retrying a task or a dead
message, unique tenant names, the agentdb_operator role, the CLI and the console."""

from __future__ import annotations

from dev.mutate.catalogue import (
    ATTACKS,
    MIGRATIONS,
    OUTBOX_SQL,
    TASKS_SQL,
    Mutant,
    T,
    m,
)

M_OPERATOR = MIGRATIONS + "0013.operator.sql"
OPS = T + "test_operator.py"
RETRY = OPS + "::test_G6_retry_puts_a_failed_or_dead_task_back_to_pending_with_its_event"
RETRY_REFUSED = OPS + "::test_G6_retry_refuses_what_is_not_failed_or_dead"
RETRY_STATEMENT = OPS + "::test_G6_the_retry_statement_alone_refuses_a_live_task_or_a_stale_version"
RAW_EDGES = OPS + "::test_G6_raw_sql_moves_back_to_pending_only_from_failed_or_dead"
MESSAGE = OPS + "::test_G10_a_dead_message_goes_back_to_pending_once_with_its_event"
NAMES = OPS + "::test_G2_a_tenant_name_finds_one_tenant_and_a_second_create_answers_it"
TAKEN_ID = T + "test_tenancy.py::test_create_tenant"
UNSETTLED = OPS + "::test_G13_unsettled_lists_no_effect_of_a_task_under_a_live_lease"
CLI_ACTORS = OPS + "::test_each_cli_action_names_its_actor_in_the_audit_trail"
ACCESS = T + "test_access.py"
OPERATOR_SCOPE = ACCESS + "::test_G15_operator_sees_and_writes_only_the_tenant_it_scopes_to"
MATRIX = ACCESS + "::test_G15_the_privilege_matrix_is_exactly_the_documented_one"
ATTACK = ATTACKS + "::test_attack_is_refused"
CONSOLE = T + "test_console_browser.py::test_console_approve_a_waiting_task_and_watch_it_finish"

MUTANTS: tuple[Mutant, ...] = (
    # ---- task_retry ------------------------------------------------------------------------
    m(
        "operator-retry-any-state",
        TASKS_SQL,
        "    WHERE t.tenant_id = $1 AND t.id = $2 AND t.state IN ('failed', 'dead')\n"
        "      AND t.state_version = $3\n",
        "    WHERE t.tenant_id = $1 AND t.id = $2\n      AND t.state_version = $3\n",
        (RETRY_STATEMENT,),
        "task_retry: a waiting task is woken to pending, its signal wait and attempts wiped",
        within="task_retry",
    ),
    m(
        "operator-retry-no-version",
        TASKS_SQL,
        "AND t.state IN ('failed', 'dead')\n      AND t.state_version = $3\n",
        "AND t.state IN ('failed', 'dead')\n      AND t.state_version >= $3\n",
        (RETRY_STATEMENT,),
        "task_retry: the version fence is a floor - a retry decided on a stale read is written",
        within="task_retry",
    ),
    m(
        "operator-retry-keeps-attempts",
        TASKS_SQL,
        "        wake_at = now(),\n        attempts = 0,\n        wait_signal = NULL,\n",
        "        wake_at = now(),\n        wait_signal = NULL,\n",
        (RETRY,),
        "task_retry: a task that died of its attempts is retried with none left",
        within="task_retry",
    ),
    m(
        "operator-retry-actor-not-recorded",
        TASKS_SQL,
        "    SELECT tenant_id, id, 'task.retried', $4, workflow_version,",
        "    SELECT tenant_id, id, 'task.retried', 'agentdb', workflow_version,",
        (RETRY,),
        "task_retry: the task.retried event does not name who retried it",
        within="task_retry",
    ),
    m(
        "operator-retry-deadline-unchecked",
        "agentdb/tasks.py",
        "        if task.deadline_at is not None and task.deadline_at <= await _db_now(db):\n"
        '            raise DeadlineExceeded(f"task {task_id} is past its deadline; it cannot run'
        ' again")\n',
        "",
        (RETRY_REFUSED,),
        "tasks.retry: a failed task past its deadline is put back to pending",
        equivalent="agent_tasks_deadline_guard refuses the same write (AG013, 0013.operator "
        "widened it to the retry edges), mapped to the same DeadlineExceeded",
        within="retry",
    ),
    m(
        "operator-deadline-guard-misses-retry",
        M_OPERATOR,
        "                       AND (OLD.state IN ('pending', 'waiting', 'running') OR NEW.state = 'pending'))\n",
        "                       AND OLD.state IN ('pending', 'waiting', 'running'))\n",
        (ATTACK,),
        "agent_tasks_deadline_guard: a dead task past its deadline goes back to pending by raw SQL",
    ),
    # ---- outbox_retry ----------------------------------------------------------------------
    m(
        "operator-outbox-retry-any-undelivered",
        OUTBOX_SQL,
        "    WHERE o.tenant_id = $1 AND o.id = $2 AND o.state = 'dead'\n",
        "    WHERE o.tenant_id = $1 AND o.id = $2 AND o.state <> 'delivered'\n",
        (MESSAGE,),
        "outbox_retry: a pending message (a relay may hold it) is retried, its attempts zeroed",
        within="outbox_retry",
    ),
    m(
        "operator-outbox-retry-keeps-attempts",
        OUTBOX_SQL,
        "    SET state = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL\n",
        "    SET state = 'pending', next_attempt_at = now(), last_error = NULL\n",
        (MESSAGE,),
        "outbox_retry: a message that died of its attempts is retried with none left",
        within="outbox_retry",
    ),
    # ---- 0013.operator ---------------------------------------------------------------------
    m(
        "operator-edge-cancelled-back",
        M_OPERATOR,
        "    ('task', 'dead',   'pending');\n",
        "    ('task', 'dead',   'pending'),\n    ('task', 'cancelled', 'pending');\n",
        (RAW_EDGES, RETRY_REFUSED),
        "agent_transitions: a cancelled task may go back to pending (a cancel is not final)",
    ),
    m(
        "operator-edge-dead-missing",
        M_OPERATOR,
        "    ('task', 'failed', 'pending'),\n    ('task', 'dead',   'pending');\n",
        "    ('task', 'failed', 'pending');\n",
        (RAW_EDGES, RETRY),
        "agent_transitions: a dead task cannot be retried",
    ),
    m(
        "operator-policy-reads-every-tenant",
        MIGRATIONS,
        "'USING (tenant_id = %s) WITH CHECK (tenant_id = %s)',\n"
        "                           tbl || '_operator_scope'",
        "'USING (true) WITH CHECK (tenant_id = %s)',\n"
        "                           tbl || '_operator_scope'",
        (OPERATOR_SCOPE,),
        "*_operator_scope: the operator sees and updates every tenant's rows",
        within="agentdb_grant_roles",
    ),
    m(
        "operator-policy-writes-any-tenant",
        MIGRATIONS,
        "'USING (tenant_id = %s) WITH CHECK (tenant_id = %s)',\n"
        "                           tbl || '_operator_scope'",
        "'USING (tenant_id = %s) WITH CHECK (true)',\n"
        "                           tbl || '_operator_scope'",
        (OPERATOR_SCOPE,),
        "*_operator_scope: the operator writes events and approvals into another tenant",
        within="agentdb_grant_roles",
    ),
    m(
        "operator-granted-delete",
        MIGRATIONS,
        "        GRANT SELECT, UPDATE ON agent_tasks, agent_operations, agent_outbox, agent_budgets,",
        "        GRANT SELECT, UPDATE, DELETE ON agent_tasks, agent_operations, agent_outbox,"
        " agent_budgets,",
        (OPERATOR_SCOPE, MATRIX),
        "agentdb_operator: deletes its tenant's tasks, effects and messages",
        within="agentdb_grant_roles",
    ),
    # ---- tenant names ----------------------------------------------------------------------
    m(
        "operator-tenant-create-no-answer",
        "agentdb/queries/tenancy.sql",
        "WHERE t.name = $2 AND NOT EXISTS (SELECT 1 FROM ins);",
        "WHERE t.name = $2 AND EXISTS (SELECT 1 FROM ins);",
        (NAMES,),
        "tenant_create: a create of a taken name answers nothing (the name's tenant is lost)",
        within="tenant_create",
    ),
    m(
        "operator-tenant-create-swallows-id-conflict",
        "agentdb/queries/tenancy.sql",
        "    ON CONFLICT (name) DO NOTHING\n",
        "    ON CONFLICT DO NOTHING\n",
        (TAKEN_ID,),
        "tenant_create: a create with an id another name holds is silently dropped",
        within="tenant_create",
    ),
    m(
        "operator-tenant-create-no-conflict",
        "agentdb/tenancy.py",
        "        if tenant_id is not None and found != tenant_id:\n",
        '        if tenant_id is not None and found != tenant_id and row["created"]:\n',
        (NAMES,),
        "create_tenant: a name held by another id answers that tenant, not IdempotencyConflict",
        within="create_tenant",
    ),
    # ---- what an operator looks at, the CLI and the console -----------------------------------
    m(
        "operator-unsettled-lists-live-lease",
        "agentdb/queries/overview.sql",
        "  AND NOT (t.state = 'running' AND t.lease_expires_at > now())\n",
        "",
        (UNSETTLED,),
        "overview_unsettled: an effect its live holder is still making is offered to reconcile",
        within="overview_unsettled",
    ),
    m(
        "operator-cli-as-ignored",
        "agentdb/tools/operate.py",
        '    return actor or f"agentdb-cli:{getpass.getuser()}"',
        '    return f"agentdb-cli:{getpass.getuser()}"',
        (CLI_ACTORS,),
        "the CLI's audit events name the OS user, not --as",
        within="_actor",
    ),
    m(
        "operator-console-csrf-optional",
        "agentdb/tools/console/auth.py",
        '        return bool(cookie and token) and hmac.compare_digest(self.csrf(cookie or ""),'
        ' token or "")',
        '        return bool(cookie) and (not token or hmac.compare_digest(self.csrf(cookie or ""),'
        " token))",
        (CONSOLE,),
        "the console takes a signed-in POST with no CSRF token (a forged form from elsewhere)",
        within="Sessions.csrf_ok",
    ),
    m(
        "operator-console-approves-as-itself",
        "agentdb/tools/console/app.py",
        "                approver=principal.name,\n",
        '                approver="agentdb-console",\n',
        (CONSOLE,),
        "the console approves as itself: G22 cannot refuse the lease holder, nor name who approved",
        within="_Console.decide.action",
    ),
)
