"""Mutants of the Citus statements (_citus/queries/routed.sql): the fences of the per-tenant forms.

A plain-Postgres run never executes these statements, so their tests run on
Citus (``make mutate-citus``, with ``AGENTDB_CITUS_DSN``); ``make mutate``
lists them as not run there.
"""

from __future__ import annotations

from dev.mutate.catalogue import FENCES, MIGRATIONS, Mutant, T, m

ROUTED_SQL = "agentdb/_citus/queries/routed.sql"
TASKS = T + "test_tasks.py"
OPERATIONS = T + "test_operations.py"
OUTBOX = T + "test_outbox.py"

ROUTED = "agentdb/_citus/routed.py"
FAIRNESS = T + "test_fairness.py::"
M_SCALE = "sql/migrations/0014.citus_scale.sql"

MUTANTS: tuple[Mutant, ...] = (
    # ---- the claim's discovery, kept as a ring (issue 40); plain: its tests drive the
    # routed walk directly on plain Postgres ----------------------------------------------
    m(
        "routed-ring-never-wraps",
        ROUTED,
        "        if self.complete:\n",
        "        if False:\n",
        (FAIRNESS + "test_G18_the_citus_claim_discovers_once_and_walks_the_ring_round_robin",),
        "the ring: a walk that reaches the end of a complete ring asks every shard again",
        within="_Ring.next",
    ),
    m(
        "routed-ring-wraps-an-arc",
        ROUTED,
        "        return rest[:want] if len(rest) >= want else None",
        "        return (rest + [t for t in self.tenants if t not in self.dry])[:want]",
        (FAIRNESS + "test_G18_an_arc_of_the_walk_is_walked_on_past_its_end_by_one_more_discovery",),
        "the ring: a partial ring is wrapped, starving the tenants beyond it",
        within="_Ring.next",
    ),
    m(
        "routed-ring-keeps-dry-tenants",
        ROUTED,
        "        live = [t for t in self.tenants if t not in self.dry]\n",
        "        live = list(self.tenants)\n",
        (FAIRNESS + "test_G18_a_ring_is_read_again_when_its_tenants_run_dry_or_it_ages",),
        "the ring: a drained tenant is offered again until the ring ages",
        within="_Ring.next",
    ),
    m(
        "routed-ring-no-second-look",
        ROUTED,
        "    if not out and not fresh:\n        # Every tenant the ring offered",
        "    if False:\n        # Every tenant the ring offered",
        (FAIRNESS + "test_G18_a_ring_drained_by_another_worker_is_read_again_at_once",),
        "the ring: a claim whose kept tenants all gave nothing returns nothing, work waiting",
        within="claim",
    ),
    m(
        "routed-due-tenants-no-wrap",
        ROUTED_SQL,
        "WHERE EXISTS (\n      SELECT 1 FROM agent_tasks k\n",
        "WHERE t.id > coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid) AND EXISTS (\n"
        "      SELECT 1 FROM agent_tasks k\n",
        (FAIRNESS + "test_G18_an_arc_of_the_walk_is_walked_on_past_its_end_by_one_more_discovery",),
        "routed_due_tenants: the discovery no longer wraps past the last tenant",
        within="routed_due_tenants",
    ),
    m(
        "citus-scale-time-only-indexes",
        MIGRATIONS,
        "    IF pg_get_indexdef('agent_outbox_pending_idx'::regclass) NOT LIKE",
        "    IF false AND pg_get_indexdef('agent_outbox_pending_idx'::regclass) NOT LIKE",
        (
            T + "citus/test_citus_plans.py::"
            "test_the_claims_read_their_tenant_by_a_tenant_leading_index",
        ),
        "agentdb_distribute: the relay's due messages by time across the shard's tenants",
        citus=True,
        within="agentdb_distribute",
    ),
    # Plain: its test drives the Citus claim's walk directly on plain Postgres.
    m(
        "routed-claim-refusal-loses-the-walk",
        "agentdb/_citus/routed.py",
        "        return []\n    rows.sort(",
        "        raise\n    rows.sort(",
        (T + "test_fairness.py::test_G18_a_tenant_refused_mid_walk_loses_only_its_own_claim",),
        "Citus claim: one tenant's AG009 raises out of the walk, orphaning the tenants claimed",
        within="_claim_tenant",
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
        within="_refusal_event",
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
        within="reserve",
    ),
    m(
        "citus-distribute-triggers-on",
        MIGRATIONS,
        "        EXECUTE format('ALTER TABLE %s DISABLE TRIGGER %I', r.rel, r.tgname);\n",
        "        PERFORM r.rel;\n",
        (
            T
            + "citus/test_citus.py::test_migrate_citus_distributes_a_database_that_already_holds_rows",
        ),
        "agentdb_distribute: a populated database's triggers fire on the copy into the shards",
        citus=True,
        within="agentdb_distribute",
    ),
    m(
        "routed-transition-no-token",
        MIGRATIONS,
        "      AND ($9::text IS NULL OR (t.lease_owner = $9 AND t.lease_token = $10))\n"
        "    RETURNING t.id,",
        "      AND ($9::text IS NULL OR (t.lease_owner = $9 AND $10::int8 IS NOT NULL))\n"
        "    RETURNING t.id,",
        (FENCES, TASKS),
        "agentdb_routed_transition: a holder whose lease was taken over (same owner name) still"
        " writes",
        citus=True,
        within="agentdb_routed_transition",
    ),
    m(
        "routed-transition-no-version",
        MIGRATIONS,
        "    WHERE t.tenant_id = $1 AND t.id = $2 AND t.state_version = $3\n"
        "      AND ($9::text IS NULL OR (t.lease_owner = $9",
        "    WHERE t.tenant_id = $1 AND t.id = $2 AND $3::int8 IS NOT NULL\n"
        "      AND ($9::text IS NULL OR (t.lease_owner = $9",
        (TASKS, FENCES),
        "agentdb_routed_transition: a stale expected_version still moves the task",
        citus=True,
        within="agentdb_routed_transition",
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
        within="routed_operation_fence",
    ),
    m(
        "routed-settle-no-lease",
        ROUTED_SQL,
        "        AND t.lease_owner = $9 AND t.lease_token = $10\n      FOR SHARE))",
        "        AND t.lease_owner = $9 AND $10::int8 IS NOT NULL\n      FOR SHARE))",
        (FENCES, OPERATIONS),
        "routed_operation_settle: a settle under a taken-over lease is accepted",
        citus=True,
        within="routed_operation_settle",
    ),
    m(
        "routed-settle-no-version",
        ROUTED_SQL,
        "WHERE o.tenant_id = $1 AND o.id = $2 AND o.state_version = $3\n",
        "WHERE o.tenant_id = $1 AND o.id = $2 AND $3::int8 IS NOT NULL\n",
        (OPERATIONS, FENCES),
        "routed_operation_settle: a stale expected_version still settles",
        citus=True,
        within="routed_operation_settle",
    ),
    m(
        "routed-release-no-token",
        ROUTED_SQL,
        "  AND t.lease_owner = $3 AND t.lease_token = $4  -- running (see",
        "  AND t.lease_owner = $3 AND $4::int8 IS NOT NULL  -- running (see",
        (FENCES, T + "test_leases.py"),
        "routed_release: a taken-over holder releases the new holder's lease",
        citus=True,
        within="routed_release",
    ),
    m(
        "routed-outbox-delivered-no-token",
        ROUTED_SQL,
        "WHERE o.tenant_id = $1 AND o.id = m.id AND o.lease_token = m.lease_token\n",
        "WHERE o.tenant_id = $1 AND o.id = m.id\n",
        (OUTBOX, FENCES),
        "routed_outbox_delivered: a relay whose claim expired marks the message delivered",
        citus=True,
        within="routed_outbox_delivered",
    ),
    m(
        "routed-claim-finished-tasks",
        MIGRATIONS,
        "        WHERE t.tenant_id = $1 AND t.state IN ('pending', 'waiting') AND t.wake_at <= now()",
        "        WHERE t.tenant_id = $1 AND t.state IN ('pending', 'waiting', 'succeeded')"
        " AND t.wake_at <= now()",
        (T + "test_leases.py", T + "test_worker.py"),
        "agentdb_routed_claim: a finished task is leased again",
        citus=True,
        within="agentdb_routed_claim",
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
        within="routed_outbox_claim",
    ),
)
