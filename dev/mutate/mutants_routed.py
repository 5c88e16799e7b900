"""Mutants of the Citus statements (_citus/queries/routed.sql): the fences of the per-tenant forms.

A plain-Postgres run never executes these statements, so their tests run on
Citus (``make mutate-citus``, with ``AGENTDB_CITUS_DSN``); ``make mutate``
lists them as not run there.
"""

from __future__ import annotations

from dev.mutate.catalogue import FENCES, M_CITUS, Mutant, T, m

ROUTED_SQL = "agentdb/_citus/queries/routed.sql"
TASKS = T + "test_tasks.py"
OPERATIONS = T + "test_operations.py"
OUTBOX = T + "test_outbox.py"

MUTANTS: tuple[Mutant, ...] = (
    # Plain: its test drives the Citus claim's walk directly on plain Postgres.
    m(
        "routed-claim-refusal-loses-the-walk",
        "agentdb/_citus/routed.py",
        "        return []\n    return rows",
        "        raise\n    return rows",
        (T + "test_fairness.py::test_G18_a_tenant_refused_mid_walk_loses_only_its_own_claim",),
        "Citus claim: one tenant's AG009 raises out of the walk, orphaning the tenants claimed",
    ),
    m(
        "routed-refused-event-as-insert-select",
        "agentdb/budgets.py",
        "@twin(_refusal_event_routed)\nasync def _refusal_event(",
        "async def _refusal_event(",
        (
            T + "test_complete_many.py::"
            "test_G19_a_refusal_after_the_statement_committed_is_that_elements_alone",
        ),
        "budgets.refusal on Citus: the event is an INSERT ... SELECT (a COPY under RLS)",
        citus=True,
    ),
    m(
        "routed-reserve-rate-limit-first",
        "agentdb/_citus/routed.py",
        '        if params.get("units") is not None:\n            # Budgets before rate limits',
        "        if False:\n            # Budgets before rate limits",
        (
            T + "citus/test_citus_budgets.py::"
            "test_G19_a_routed_reservation_locks_budgets_before_rate_limits",
        ),
        "routed reserve: the operation's insert locks the rate limit before the budgets",
        citus=True,
    ),
    m(
        "citus-distribute-triggers-on",
        M_CITUS,
        "        EXECUTE format('ALTER TABLE %s DISABLE TRIGGER %I', r.rel, r.tgname);\n",
        "        PERFORM r.rel;\n",
        (
            T
            + "citus/test_citus.py::test_migrate_citus_distributes_a_database_that_already_holds_rows",
        ),
        "agentdb_distribute: a populated database's triggers fire on the copy into the shards",
        citus=True,
    ),
    m(
        "routed-transition-no-token",
        ROUTED_SQL,
        "  AND ($9::text IS NULL OR (t.lease_owner = $9 AND t.lease_token = $10))\nRETURNING t.id,",
        "  AND ($9::text IS NULL OR (t.lease_owner = $9 AND $10::int8 IS NOT NULL))\nRETURNING t.id,",
        (FENCES, TASKS),
        "routed_transition: a holder whose lease was taken over (same owner name) still writes",
        citus=True,
    ),
    m(
        "routed-transition-no-version",
        ROUTED_SQL,
        "WHERE t.tenant_id = $1 AND t.id = $2 AND t.state_version = $3\n"
        "  AND ($9::text IS NULL OR (t.lease_owner = $9",
        "WHERE t.tenant_id = $1 AND t.id = $2 AND $3::int8 IS NOT NULL\n"
        "  AND ($9::text IS NULL OR (t.lease_owner = $9",
        (TASKS, FENCES),
        "routed_transition: a stale expected_version still moves the task",
        citus=True,
    ),
    m(
        "routed-reserve-no-lease",
        ROUTED_SQL,
        "       ($3::text IS NULL OR (t.state = 'running' AND t.lease_owner = $3\n"
        "                             AND t.lease_token = $4)) AS ok",
        "       ($3::text IS NULL OR $4::int8 IS NOT NULL OR true) AS ok",
        (FENCES, OPERATIONS),
        "routed_operation_fence: a reservation under a lost lease is accepted",
        citus=True,
    ),
    m(
        "routed-settle-no-lease",
        ROUTED_SQL,
        "        AND t.lease_owner = $9 AND t.lease_token = $10\n      FOR SHARE))",
        "        AND t.lease_owner = $9 AND $10::int8 IS NOT NULL\n      FOR SHARE))",
        (FENCES, OPERATIONS),
        "routed_operation_settle: a settle under a taken-over lease is accepted",
        citus=True,
    ),
    m(
        "routed-settle-no-version",
        ROUTED_SQL,
        "WHERE o.tenant_id = $1 AND o.id = $2 AND o.state_version = $3\n",
        "WHERE o.tenant_id = $1 AND o.id = $2 AND $3::int8 IS NOT NULL\n",
        (OPERATIONS, FENCES),
        "routed_operation_settle: a stale expected_version still settles",
        citus=True,
    ),
    m(
        "routed-release-no-token",
        ROUTED_SQL,
        "  AND t.lease_owner = $3 AND t.lease_token = $4  -- running (see",
        "  AND t.lease_owner = $3 AND $4::int8 IS NOT NULL  -- running (see",
        (FENCES, T + "test_leases.py"),
        "routed_release: a taken-over holder releases the new holder's lease",
        citus=True,
    ),
    m(
        "routed-outbox-delivered-no-token",
        ROUTED_SQL,
        "WHERE o.tenant_id = $1 AND o.id = m.id AND o.lease_token = m.lease_token\n",
        "WHERE o.tenant_id = $1 AND o.id = m.id\n",
        (OUTBOX, FENCES),
        "routed_outbox_delivered: a relay whose claim expired marks the message delivered",
        citus=True,
    ),
    m(
        "routed-claim-finished-tasks",
        ROUTED_SQL,
        "    WHERE t.tenant_id = $1 AND t.state IN ('pending', 'waiting') AND t.wake_at <= now()",
        "    WHERE t.tenant_id = $1 AND t.state IN ('pending', 'waiting', 'succeeded')"
        " AND t.wake_at <= now()",
        (T + "test_leases.py", T + "test_worker.py"),
        "routed_claim: a finished task is leased again",
        citus=True,
    ),
    m(
        "routed-outbox-claim-hands-out-an-exhausted-message",
        ROUTED_SQL,
        "    SELECT id, attempts >= max_attempts AS exhausted, now() + $4 AS visible_until\n",
        "    SELECT id, false AS exhausted, now() + $4 AS visible_until\n",
        (OUTBOX,),
        "routed_outbox_claim: a message whose relay stops mid-publish every time is claimed"
        " for ever",
        citus=True,
    ),
)
