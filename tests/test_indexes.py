"""Each non-unique index serves the path it was built for (claim, relay, retention, lookups),
and so does each unique key that also serves a lookup.

Sequential scans are switched off so the planner's choice on tiny tables
shows which index can answer the query at all; the claim path at 10k and 1M
rows is measured by the benchmark, not here.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import tasks
from agentdb.errors import CONSTRAINTS
from tests import factories as F

# A fixed tenant/task id; the plan, not the data, is what is checked.
INDEX_QUERIES: dict[str, str] = {
    "agent_budget_holds_budget_idx": (
        "SELECT operation_id, amount FROM agent_budget_holds"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND budget_id = '00000000-0000-4000-8000-000000000002'"
    ),
    "agent_outbox_dead_idx": (
        "SELECT tenant_id, count(*) FROM agent_outbox WHERE state = 'dead' GROUP BY tenant_id"
    ),
    "agent_operations_settled_idx": (
        "SELECT id FROM agent_operations WHERE state IN ('succeeded', 'failed')"
        " AND updated_at <= now() - interval '30 days' LIMIT 100"
    ),
    "agent_tasks_finished_idx": (
        "SELECT id FROM agent_tasks WHERE state IN ('succeeded', 'failed', 'cancelled', 'dead')"
        " AND updated_at <= now() - interval '30 days' LIMIT 100"
    ),
    "agent_schedules_due_idx": (
        "SELECT tenant_id, id FROM agent_schedules WHERE NOT paused AND next_tick_at <= now()"
        " ORDER BY next_tick_at LIMIT 100"
    ),
    "agent_tasks_deadline_idx": (
        "SELECT tenant_id, id FROM agent_tasks WHERE deadline_at <= now()"
        " AND deadline_at IS NOT NULL AND state IN ('pending', 'waiting', 'running')"
        " ORDER BY deadline_at LIMIT 100 FOR UPDATE SKIP LOCKED"
    ),
    "agent_tasks_due_idx": (
        "SELECT id FROM agent_tasks WHERE state IN ('pending', 'waiting')"
        " AND tenant_id = '00000000-0000-4000-8000-000000000001' AND task_type = 't'"
        " AND wake_at <= now() ORDER BY wake_at LIMIT 10 FOR UPDATE SKIP LOCKED"
    ),
    "agent_tasks_running_idx": (
        "SELECT count(*) FROM agent_tasks WHERE state = 'running'"
        " AND tenant_id = '00000000-0000-4000-8000-000000000001' AND task_type = 't'"
    ),
    "agent_tasks_lease_expiry_idx": (
        "SELECT id FROM agent_tasks WHERE lease_expires_at <= now()"
        " ORDER BY lease_expires_at LIMIT 10"
    ),
    "agent_operations_task_idx": (
        "SELECT id FROM agent_operations"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND task_id = '00000000-0000-4000-8000-000000000001'"
    ),
    "agent_operations_unsettled_idx": (
        "SELECT id FROM agent_operations"
        " WHERE state IN ('reserved', 'in_flight', 'unknown') AND updated_at < now()"
    ),
    # Unique keys that serve the lookups separate indexes once served: a task's
    # events (in order: a sort of a few rows), an operation's events.
    "agent_events_task_version_key": (
        "SELECT id FROM agent_events"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND task_id = '00000000-0000-4000-8000-000000000001'"
    ),
    "agent_events_operation_version_key": (
        "SELECT id FROM agent_events"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND operation_id = '00000000-0000-4000-8000-000000000001'"
    ),
    # Both retention classes of the audit trail read one range (0023.event_expiry);
    # test_G9_both_event_purges_and_their_backlog_read_the_expiry_index reads the
    # real statements.
    "agent_events_expiry_idx": (
        "SELECT id FROM agent_events"
        " WHERE (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()"
        " AND retain_until <= now() LIMIT 100"
    ),
    # The tasks' unique keys are partial (0016.partial_keys): a parent's children,
    # keyed or not, are still read from the child key's index.
    "agent_tasks_child_key": (
        "SELECT count(*) FROM agent_tasks"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND parent_id = '00000000-0000-4000-8000-000000000002'"
    ),
    "agent_tasks_schedule_tick_key": (
        "SELECT id FROM agent_tasks"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND schedule_id = '00000000-0000-4000-8000-000000000002'"
    ),
    "agent_tasks_dedupe_key": (
        "SELECT id FROM agent_tasks"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001' AND dedupe_key = 'k'"
    ),
    "agent_outbox_pending_idx": (
        "SELECT id FROM agent_outbox WHERE state = 'pending' AND next_attempt_at <= now()"
        " ORDER BY next_attempt_at LIMIT 10 FOR UPDATE SKIP LOCKED"
    ),
    "agent_outbox_delivered_idx": (
        "SELECT id FROM agent_outbox WHERE state = 'delivered' AND delivered_at < now() LIMIT 100"
    ),
    "agent_outbox_task_idx": (
        "SELECT id FROM agent_outbox"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND task_id = '00000000-0000-4000-8000-000000000001'"
    ),
    "agent_inbox_processed_at_idx": (
        "SELECT message_id FROM agent_inbox WHERE processed_at < now() LIMIT 100"
    ),
    "agent_artifacts_task_idx": (
        "SELECT id FROM agent_artifacts"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND task_id = '00000000-0000-4000-8000-000000000001'"
    ),
    "agent_artifacts_operation_idx": (
        "SELECT id FROM agent_artifacts"
        " WHERE tenant_id = '00000000-0000-4000-8000-000000000001'"
        " AND operation_id = '00000000-0000-4000-8000-000000000001'"
    ),
}


def _index_names(plan: object) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(str(plan["Index Name"]))
        for value in plan.values():
            found |= _index_names(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _index_names(value)
    return found


@pytest.mark.parametrize("index", sorted(INDEX_QUERIES), ids=lambda n: f"{CONSTRAINTS[n]}-{n}")
async def test_index_serves_its_path(index: str, admin_conn: asyncpg.Connection) -> None:
    await admin_conn.execute("SET enable_seqscan = off")
    raw = await admin_conn.fetchval("EXPLAIN (FORMAT JSON) " + INDEX_QUERIES[index])
    # A partition's index is read as the partitioned table's index it was cloned from.
    used = {
        await admin_conn.fetchval(
            "SELECT coalesce(pg_partition_root($1::regclass), $1::regclass)::text", name
        )
        for name in _index_names(json.loads(raw))
    }
    assert index in used


_TASK_KEYS = ("agent_tasks_dedupe_key", "agent_tasks_child_key", "agent_tasks_schedule_tick_key")


async def _index_tuples(conn: asyncpg.Connection, *names: str) -> dict[str, float]:
    # ANALYZE sets an index's reltuples to the rows it holds: every live row, or those
    # its predicate lets in (all of them here - the sample is the whole table).
    await conn.execute("ANALYZE agent_tasks")
    rows = await conn.fetch(
        "SELECT relname::text AS name, reltuples FROM pg_class WHERE relname = ANY($1::text[])",
        list(names),
    )
    return {r["name"]: r["reltuples"] for r in rows}


async def test_G3_the_task_keys_take_no_entry_for_a_task_without_one(
    admin_conn: asyncpg.Connection, agentdb_tenant: uuid.UUID
) -> None:
    """A task with no dedupe key, parent or schedule adds nothing to the three partial
    keys, however many versions it has (issue 41: a claim or a finish is no HOT update,
    and each entry was WAL), while the primary key takes it. With keys, each key takes
    its task (the control: the predicates do not leave everything out)."""
    for _ in range(5):
        task = await tasks.create(admin_conn, agentdb_tenant, "plain")
        await F.update_task(admin_conn, agentdb_tenant, task.id, state="cancelled", state_version=1)
    counts = await _index_tuples(admin_conn, "agent_tasks_pkey", *_TASK_KEYS)
    assert counts["agent_tasks_pkey"] >= 5
    assert {k: counts[k] for k in _TASK_KEYS} == dict.fromkeys(_TASK_KEYS, 0)

    parent = await tasks.create(admin_conn, agentdb_tenant, "parent", dedupe_key="p")
    await tasks.create(admin_conn, agentdb_tenant, "child", parent=parent.id, child_key="c")
    schedule = await admin_conn.fetchval(
        "INSERT INTO agent_schedules (tenant_id, name, task_type, every, anchor, next_tick_at)"
        " VALUES ($1, 's', 't', interval '1 minute', date_trunc('minute', now()),"
        " date_trunc('minute', now())) RETURNING id",
        agentdb_tenant,
    )
    await F.create_task(
        admin_conn,
        agentdb_tenant,
        schedule_id=schedule,
        schedule_tick=await admin_conn.fetchval("SELECT date_trunc('minute', now())"),
    )
    counts = await _index_tuples(admin_conn, *_TASK_KEYS)
    assert counts == {
        "agent_tasks_dedupe_key": 2,  # the parent's key and the child's ('child/...')
        "agent_tasks_child_key": 1,
        "agent_tasks_schedule_tick_key": 1,
    }


async def test_G7_an_update_of_a_full_page_s_task_or_operation_stays_on_its_page(
    admin_conn: asyncpg.Connection, agentdb_tenant: uuid.UUID
) -> None:
    """0018.room_to_update: tasks and operations leave a fifth of each page free, so the
    version a claim or a settle writes goes on the old one's page (no other page to
    dirty, and after a checkpoint no second full-page image in the WAL). The first
    page is full of inserts when the test updates its first task and operation; at the
    default fillfactor both new versions would move to another page."""
    made = [await tasks.create(admin_conn, agentdb_tenant, "t") for _ in range(60)]
    first = made[0].id

    async def page(sql: str, *args: object) -> int:
        return int(await admin_conn.fetchval(sql, *args))

    task_sql = "SELECT (ctid::text::point)[0] FROM agent_tasks WHERE tenant_id = $1 AND id = $2"
    assert await page(task_sql, agentdb_tenant, made[-1].id)  # the first page is full
    before = await page(task_sql, agentdb_tenant, first)
    await F.update_task(admin_conn, agentdb_tenant, first, state="cancelled", state_version=1)
    assert await page(task_sql, agentdb_tenant, first) == before

    ops = [
        await F.create_operation(admin_conn, agentdb_tenant, made[1].id, idempotency_key=f"k{i}")
        for i in range(60)
    ]
    op_sql = "SELECT (ctid::text::point)[0] FROM agent_operations WHERE tenant_id = $1 AND id = $2"
    assert await page(op_sql, agentdb_tenant, ops[-1])
    before = await page(op_sql, agentdb_tenant, ops[0])
    await F.update_operation(admin_conn, agentdb_tenant, ops[0], state="in_flight", state_version=1)
    assert await page(op_sql, agentdb_tenant, ops[0]) == before


def _subplan(plan: object, name: str) -> object:
    """The node of ``plan`` whose ``Subplan Name`` is ``name`` (a CTE: ``CTE x``), or None."""
    if isinstance(plan, dict):
        if plan.get("Subplan Name") == name:
            return plan
        values: list[object] = list(plan.values())
    elif isinstance(plan, list):
        values = list(plan)
    else:
        return None
    for value in values:
        found = _subplan(value, name)
        if found is not None:
            return found
    return None


@pytest.mark.plain_postgres("the claim of one node: Citus claims tenant by tenant (routed.py)")
async def test_G12_the_claim_reads_expired_leases_by_expiry_whatever_the_statistics_say(
    admin_conn: asyncpg.Connection, agentdb_tenant: uuid.UUID
) -> None:
    """The claim's first step (lease_claim's ``expired``) is read from the range of expired
    leases of agent_tasks_lease_expiry_idx, even when the last ANALYZE saw no running task.
    Written with a state test, agent_tasks_running_idx could answer it too, and with those
    statistics the planner read it whole and sorted it: under a held snapshot, an entry per
    task that was running since (0022.lease_expiry). Sequential scans stay on: the choice
    between the two indexes is the planner's own."""
    from agentdb import _db

    await admin_conn.execute("SET session_replication_role = replica")  # rows, no history
    try:
        await admin_conn.execute(
            "INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, state, wake_at)"
            " SELECT $1, 't', 'v1', s, now() + interval '1 hour'"
            " FROM unnest(ARRAY['pending', 'succeeded']) s, generate_series(1, 5000)",
            agentdb_tenant,
        )
    finally:
        await admin_conn.execute("SET session_replication_role = origin")
    await admin_conn.execute("ANALYZE agent_tasks")
    claim = _db.QUERIES["lease_claim"]
    args = claim.bind(
        {"lease_owner": "w", "batch": 10, "lease_ttl": None, "task_types": None,
         "after_tenant": None}
    )  # fmt: skip
    raw = await admin_conn.fetchval("EXPLAIN (FORMAT JSON) " + claim.sql, *args)
    expired = _subplan(json.loads(raw), "CTE expired")
    assert expired is not None
    assert _index_names(expired) == {"agent_tasks_lease_expiry_idx"}


async def test_G9_both_event_purges_and_their_backlog_read_the_expiry_index(
    admin_conn: asyncpg.Connection,
) -> None:
    """The statements retention runs on the audit trail - agentdb_purge's 'event_payloads'
    and 'events' steps, and status_purge_backlog's two counts - each read
    agent_events_expiry_idx (0023.event_expiry): one entry per event serves both classes.
    Each names the index's expression beside its own predicate; without it (a mutant that
    drops that conjunct) no index answers and the planner scans the table. The purge is
    counted by the index scans its transaction made, the counts by their plan."""
    from agentdb import _db

    await admin_conn.execute("SET enable_seqscan = off")
    # By month, the scans are the partitions' indexes' (pg_partition_tree lists them; it
    # lists nothing for an index of one table).
    scans = (
        "SELECT sum(pg_stat_get_xact_numscans(r)) FROM ("
        " SELECT relid AS r FROM pg_partition_tree('agent_events_expiry_idx'::regclass)"
        " UNION SELECT 'agent_events_expiry_idx'::regclass) i"
    )
    for kind in ("event_payloads", "events"):
        async with admin_conn.transaction():
            before = await admin_conn.fetchval(scans)
            await admin_conn.fetchval("SELECT agentdb_purge($1, 10, interval '0')", kind)
            assert await admin_conn.fetchval(scans) > before, kind
    backlog = _db.QUERIES["status_purge_backlog"]
    args = backlog.bind({"outbox_delivered": timedelta(days=7), "inbox": timedelta(days=7)})
    raw = await admin_conn.fetchval("EXPLAIN (FORMAT JSON) " + backlog.sql, *args)
    roots = [
        await admin_conn.fetchval(
            "SELECT coalesce(pg_partition_root($1::regclass), $1::regclass)::text", name
        )
        for name in _index_list(json.loads(raw))
    ]
    # Both counts; by month, each reads the index of every partition.
    assert roots.count("agent_events_expiry_idx") >= 2
    assert {r for r in roots if r.startswith("agent_events")} == {"agent_events_expiry_idx"}


def _index_list(plan: object) -> list[str]:
    if isinstance(plan, dict):
        here = [str(plan["Index Name"])] if "Index Name" in plan else []
        return here + [n for v in plan.values() for n in _index_list(v)]
    if isinstance(plan, list):
        return [n for v in plan for n in _index_list(v)]
    return []
