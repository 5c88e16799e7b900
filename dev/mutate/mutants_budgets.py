"""Mutants of the budget and rate-limit guards (G19): the schema, the statements, the worker."""

from __future__ import annotations

from dev.mutate.catalogue import ATTACKS, M_BUDGETS, MIGRATIONS, OPS_SQL, Mutant, T, m

TESTS = T + "test_budgets.py"
RACE = TESTS + "::test_G19_fifty_concurrent_reservations_against_a_budget_that_fits_ten"
MODEL = TESTS + "::test_G19_stateful_model_of_reserve_complete_fail_unknown_reconcile"
ATTACK = ATTACKS + "::test_attack_is_refused"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "rate-limit-worker-instant",
        MIGRATIONS,
        "        at := least(at, NEW.created_at);",
        "        at := at;",
        (
            TESTS
            + "::test_G19_a_call_that_waited_past_its_window_is_refused_not_counted_in_the_next[tenant]",
        ),
        "agentdb_count_call on Citus: a call is counted at the worker's now(), after its "
        "coordinator transaction (and its event) began",
        citus=True,
        within="agentdb_count_call",
    ),
    m(
        "rate-limit-worker-instant-rearm",
        MIGRATIONS,
        "        at := least(at, NEW.updated_at);",
        "        at := at;",
        (
            TESTS + "::test_G19_a_call_that_waited_past_its_window_is_refused_not_counted_in_the_"
            "next[tenant-rearm]",
        ),
        "agentdb_count_call on Citus: a re-arm is counted at the worker's now()",
        citus=True,
        within="agentdb_count_call",
    ),
    m(
        "complete-many-books-untold",
        OPS_SQL,
        "               'released', (SELECT jsonb_object_agg(x.unit, 0) FROM hs x\n",
        "               'unreleased', (SELECT jsonb_object_agg(x.unit, 0) FROM hs x\n",
        (
            T
            + "test_complete_many.py::test_G19_complete_many_records_what_complete_records_of_the_books",
        ),
        "operation_complete_many: its event leaves out what was released, which complete records",
        within="operation_complete_many",
    ),
    m(
        "budget-rearm-refusal-bare",
        "agentdb/operations.py",
        "        except RateLimited as refused:  # a re-arm is a call too (G19)",
        "        except ZeroDivisionError as refused:  # a re-arm is a call too (G19)",
        (TESTS + "::test_G19_a_retry_over_the_rate_limit_is_refused_with_its_event_and_when",),
        "reserve: a re-arm over the rate limit is refused without its event or retry_after",
        within="_decide",
    ),
    m(
        "budget-period-switch-refunds",
        MIGRATIONS,
        "    IF NEW.period IS DISTINCT FROM OLD.period AND (OLD.spent > 0 OR OLD.held > 0) THEN",
        "    IF false THEN",
        (ATTACK,),
        "agentdb_guard_budget: switching the period of a spent budget starts it again at 0",
        within="agentdb_guard_budget",
    ),
    m(
        "budget-books-batched-apart",
        MIGRATIONS,
        "                              WHERE a.tenant_id = op.tenant_id AND a.operation_id = op.id)\n"
        "            FOR UPDATE OF h SKIP LOCKED)",
        "                              WHERE a.tenant_id = op.tenant_id AND a.operation_id = op.id)\n"
        "            LIMIT 1 FOR UPDATE OF h SKIP LOCKED)",
        (TESTS + "::test_G19_retention_of_many_settled_operations_in_small_batches",),
        "agentdb_purge_books: the books of one operation per step, whatever the purge takes",
        within="agentdb_purge_books",
    ),
    m(
        "budget-check-ignores-held",
        M_BUDGETS,
        "    CONSTRAINT agent_budgets_within_limit CHECK (spent + held <= limit_amount)",
        "    CONSTRAINT agent_budgets_within_limit CHECK (spent <= limit_amount)",
        (RACE,),
        "agent_budgets_within_limit: what is held does not count, so racing holds overspend",
    ),
    m(
        "budget-reserve-holds-nothing",
        OPS_SQL,
        "    WHERE b.tenant_id = $1 AND b.unit = c.unit AND (b.task_id IS NULL OR b.task_id = $3)\n"
        "      AND EXISTS (SELECT 1 FROM ins)",
        "    WHERE b.tenant_id = $1 AND b.unit = c.unit AND (b.task_id IS NULL OR b.task_id = $3)\n"
        "      AND false",
        (RACE,),
        "operation_reserve: the cost is never held on the budget",
        within="operation_reserve",
    ),
    m(
        "budget-task-budget-ignored",
        OPS_SQL,
        "    WHERE b.tenant_id = $1 AND b.unit = c.unit AND (b.task_id IS NULL OR b.task_id = $3)\n"
        "      AND EXISTS (SELECT 1 FROM ins)",
        "    WHERE b.tenant_id = $1 AND b.unit = c.unit AND b.task_id IS NULL\n"
        "      AND EXISTS (SELECT 1 FROM ins)",
        (TESTS + "::test_G19_a_task_budget_and_the_tenant_budget_both_hold",),
        "operation_reserve: a task's own budget is never held against",
        within="operation_reserve",
    ),
    m(
        "budget-settle-never-releases",
        OPS_SQL,
        "    SET spent = b.spent + x.settled, held = b.held - x.amount, updated_at = now()",
        "    SET spent = b.spent + x.settled, updated_at = now()",
        (MODEL,),
        "operation_settle: a settled hold stays held",
        within="operation_settle",
    ),
    m(
        "budget-settle-spends-the-estimate",
        OPS_SQL,
        "             WHERE a.unit = h.unit), h.amount) END\n    FROM upd u",
        "             WHERE a.unit = h.unit AND false), h.amount) END\n    FROM upd u",
        (MODEL,),
        "operation_settle: the actual cost is ignored and the whole estimate is spent",
        within="operation_settle",
    ),
    m(
        "budget-unknown-releases",
        OPS_SQL,
        "      AND u.state IN ('succeeded', 'failed')\n    RETURNING h.budget_id",
        "      AND u.state IN ('succeeded', 'failed', 'unknown')\n    RETURNING h.budget_id",
        (TESTS + "::test_G19_unknown_keeps_the_hold_until_reconciled", MODEL),
        "operation_settle: an unknown outcome releases its hold although the money may be spent",
        within="operation_settle",
    ),
    m(
        "budget-guard-allows-refund",
        MIGRATIONS,
        "    ELSIF NEW.spent < OLD.spent OR NEW.window_start IS DISTINCT FROM OLD.window_start THEN",
        "    ELSIF NEW.window_start IS DISTINCT FROM OLD.window_start THEN",
        (ATTACK + "[G19-agent_budgets_guard-refund-inside-the-window]",),
        "agent_budgets_guard: spent may be lowered inside its window (a refund hides a spend)",
        within="agentdb_guard_budget",
    ),
    m(
        "budget-hold-guard-allows-rehold",
        MIGRATIONS,
        "    IF OLD.state <> 'held'\n       OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id",
        "    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id",
        (ATTACK + "[G19-agent_budget_holds_guard-released-hold-re-held]",),
        "agent_budget_holds_guard: a released or settled hold can be changed again",
        within="agentdb_guard_budget_hold",
    ),
    m(
        "rate-limit-never-full",
        MIGRATIONS,
        "        IF step.used > lim.max_calls THEN\n            over := format('tenant",
        "        IF step.used > lim.max_calls + 1000 THEN\n            over := format('tenant",
        (ATTACK + "[G19-agent_operations_rate_limit]",),
        "agentdb_count_call: the tenant's limit is never reached by the trigger; the CHECK "
        "behind it still refuses, but as a bare CHECK violation, not the trigger's AG011",
        within="agentdb_count_call",
    ),
    m(
        "rate-limit-late-call-counted",
        MIGRATIONS,
        "    IF FOUND AND at < lim.window_start AND clock_timestamp() >= lim.window_start THEN\n"
        "        over := format('tenant",
        "    IF false THEN\n        over := format('tenant",
        (
            TESTS
            + "::test_G19_a_call_that_waited_past_its_window_is_refused_not_counted_in_the_next[tenant]",
        ),
        "agentdb_count_call: a call that waited past its window counts in the next one",
        within="agentdb_count_call",
    ),
    m(
        "rate-limit-global-late-call-counted",
        MIGRATIONS,
        "        IF FOUND AND at < lim.window_start AND clock_timestamp() >= lim.window_start THEN\n"
        "            over := format('global",
        "        IF false THEN\n            over := format('global",
        (
            TESTS
            + "::test_G19_a_call_that_waited_past_its_window_is_refused_not_counted_in_the_next[global]",
        ),
        "agentdb_count_call: a call that waited past the global window counts in the next one",
        within="agentdb_count_call",
    ),
    m(
        "rate-limit-window-never-rolls",
        MIGRATIONS,
        "    IF p_start + p_per <= p_at THEN\n        used := 1;",
        "    IF false THEN\n        used := 1;",
        (TESTS + "::test_G19_a_rate_limit_holds_under_load_from_worker_processes",),
        "agentdb_rate_step: calls of past windows keep counting (the limit starves the action)",
        within="agentdb_rate_step",
    ),
    m(
        "rate-limit-retry-uncounted",
        M_BUDGETS,
        "-- G19\nCREATE TRIGGER agent_operations_rate_limit_retry\n    AFTER UPDATE OF state ON agent_operations\n"
        "    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')",
        "-- G19\nCREATE TRIGGER agent_operations_rate_limit_retry\n    AFTER UPDATE OF state ON agent_operations\n"
        "    FOR EACH ROW WHEN (false)",
        (ATTACK + "[G19-agent_operations_rate_limit_retry]",),
        "agent_operations_rate_limit_retry: a re-armed retry calls the provider uncounted",
    ),
    m(
        "rate-limit-global-ignored",
        MIGRATIONS,
        "        WHERE g.action = NEW.action FOR UPDATE;",
        "        WHERE g.action = NEW.action AND false FOR UPDATE;",
        (TESTS + "::test_G19_a_global_rate_limit_spans_tenants",),
        "agentdb_count_call: the global limit is never counted",
        within="agentdb_count_call",
    ),
    m(
        "budget-error-unmapped",
        "agentdb/_db/errormap.py",
        '        "BudgetExceeded": BudgetExceeded,\n',
        '        "BudgetExceeded": RateLimited,\n',
        (TESTS + "::test_G19_unknown_keeps_the_hold_until_reconciled",),
        "error_for: the budget CHECK's refusal comes out as the wrong error class",
    ),
    m(
        "worker-rate-limit-burns-an-attempt",
        "agentdb/worker/loop.py",
        'outcome = Retry(storable(f"RateLimited: {exc}"), after, refund_attempt=True)',
        'outcome = Retry(storable(f"RateLimited: {exc}"), after, refund_attempt=False)',
        (TESTS + "::test_G19_a_rate_limit_holds_under_load_from_worker_processes",),
        "worker: a rate-limited attempt is counted, so a throttled task can die of it",
        within="Worker._run_job",
    ),
)
