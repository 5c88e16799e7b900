"""The plans Citus makes of the runtime's statements, and what a claim costs in remote
commands under load (issue 40).

Every statement the runtime runs on a distributed schema for one tenant must be a
router plan: one task, on the node that holds the tenant's shards, with no
distributed subplan (recursive planning: intermediate results and a final step
on the coordinator) and no pull to the coordinator. The discovery reads that
find which tenants have work are the only statements that read every shard, and
even they must push down whole. Checked with EXPLAIN on the cluster, statement
by statement, from the statement files themselves: a statement added later is
checked too, or must say here why not.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from agentdb import _db, leases, tasks, tenancy
from agentdb._citus import routed
from tests.citus.conftest import Cluster
from tests.test_routed_twins import _DELEGATED, _body

# The modules whose statements the runtime runs: imported, their statement files load.
from agentdb import (  # noqa: F401  isort: skip
    budgets,
    children,
    inbox,
    operations,
    outbox,
    schedules,
    signals,
    steps,
)

#: Multi-shard by design: where work is (read every shard, pushed down whole, kept
#: for a second by the claim's ring: agentdb._citus.routed._Ring).
DISCOVERY = {
    "routed_due_tenants", "routed_outbox_due_tenants", "routed_deadline_tenants",
    "routed_exhausted_tenants",
}  # fmt: skip

#: Plain statements (not routed) that name a tenant and are not router plans on Citus,
#: each with why it may stay so. A statement with a routed twin never runs on Citus.
NOT_ROUTER = {
    "schedule_create": "creating a schedule: not on a hot path (its task insert is an "
    "INSERT ... SELECT that Citus plans through the coordinator, once per schedule)",
    "step_take_signal": "a durable handler's signal wait consumes its signal and writes its "
    "step in one statement; planned through the coordinator (issue 40 leaves it: "
    "once per wait, not per task)",
    "budget_refused": "a refused reservation's event, once per refusal; Citus cannot "
    "plan it with parameters (the routed refusal writes the event as a single-row insert)",
    "step_insert": "EXPLAINed without its parameters' types (asyncpg infers none here); "
    "a single-row INSERT ... VALUES, routed like routed_task_event",
}

_SAMPLE: dict[str, Any] = {
    "text": "x", "int8": 1, "int4": 1, "interval": timedelta(minutes=1), "jsonb": "{}",
    "timestamptz": datetime.now(UTC), "bool": False, "text[]": ["x"], "int8[]": [1],
    "int4[]": [1], "jsonb[]": ["{}"], "timestamptz[]": [datetime.now(UTC)],
}  # fmt: skip


def _args(q: _db.Query, tenant: uuid.UUID) -> list[Any]:
    out: list[Any] = []
    for p in q.params:
        if p.type == "uuid":
            out.append(tenant if p.name == "tenant_id" else uuid.uuid4())
        elif p.type == "uuid[]":
            out.append([tenant] if p.name == "tenant_ids" else [uuid.uuid4()])
        else:
            out.append(_SAMPLE[p.type])
    return out


def _statement(q: _db.Query) -> str:
    """What runs on the tenant's node for ``q``: its text, or for a call Citus delegates
    whole (0021.delegated_writes) the statement in the function's body, whose parameters
    are the call's in the same order (the INSERTs beside it are single-row VALUES, as
    routed_task_event)."""
    if q.name not in _DELEGATED:
        return q.sql
    body = _body(_DELEGATED[q.name])
    start = body.index(" IN\n") + len(" IN\n")
    return body[start : body.index("\n    LOOP\n", start)]


async def _plan(conn: asyncpg.Connection, q: _db.Query, tenant: uuid.UUID) -> str:
    # Only the parameters the statement uses, numbered again: a function's statement
    # leaves some of the call's to the rest of its body, and a parameter no statement
    # uses has no type the server can infer.
    sql, args = _statement(q), _args(q, tenant)
    used = sorted({int(n) for n in re.findall(r"\$(\d+)\b", sql)})
    again = {old: new for new, old in enumerate(used, 1)}
    sql = re.sub(r"\$(\d+)\b", lambda m: f"${again[int(m.group(1))]}", sql)
    async with conn.transaction():
        rows = await conn.fetch("EXPLAIN " + sql, *(args[n - 1] for n in used))
    return "\n".join(r[0] for r in rows)


def _tenant_statements() -> list[_db.Query]:
    """Every statement that names one tenant (a ``tenant_id`` parameter) and runs on Citus:
    the routed ones, and the plain ones without a routed twin."""
    twinned = _twinned_statements()
    return sorted(
        (
            q for q in _db.QUERIES.values()
            if any(p.name == "tenant_id" for p in q.params) and q.name not in twinned
        ),
        key=lambda q: q.name,
    )  # fmt: skip


def _twinned_statements() -> set[str]:
    """The plain statements a routed twin stands in for on Citus (never run there)."""
    from tests.test_routed_twins import TWINS

    return {t.single for t in TWINS}


def _router(plan: str) -> str | None:
    """What is wrong with ``plan`` for a one-tenant statement; ``None``: a router plan."""
    counts = {line.strip() for line in plan.splitlines() if "Task Count" in line}
    if "Subplan" in plan:
        return "a distributed subplan (recursive planning)"
    if "pull to coordinator" in plan or "repartition" in plan:
        return "an INSERT ... SELECT through the coordinator"
    if counts - {"Task Count: 1", "Task Count: 0"}:
        return f"more than one task: {sorted(counts)}"
    if not counts and "Custom Scan (Citus" in plan:
        return "a Citus plan without a task count"
    return None


async def test_every_one_tenant_statement_is_a_router_plan(
    conn: asyncpg.Connection, three: Any
) -> None:
    """EXPLAIN of each statement that names one tenant: one task, no subplan, no pull to the
    coordinator - or its reason in NOT_ROUTER. Fails on the routed outbox claim as it was
    (two data-modifying CTEs and a UNION ALL: three subplans)."""
    wrong: dict[str, str] = {}
    routed_seen = 0
    for q in _tenant_statements():
        if q.name in NOT_ROUTER:
            continue
        try:
            plan = await _plan(conn, q, three.x)
        except asyncpg.PostgresError as exc:
            wrong[q.name] = f"{type(exc).__name__}: {exc}"
            continue
        if "Custom Scan (Citus" not in plan and "Task Count" not in plan:
            continue  # a call or a local table only (a procedure, the tenant's settings)
        routed_seen += q.source.endswith("routed.sql")
        problem = _router(plan)
        if problem is not None:
            wrong[q.name] = problem
    assert wrong == {}
    assert routed_seen >= 20  # the routed statements were planned, not skipped


async def test_the_reasons_name_statements_that_exist() -> None:
    names = {q.name for q in _tenant_statements()}
    assert set(NOT_ROUTER) <= names


async def test_the_discovery_reads_push_down_whole(conn: asyncpg.Connection) -> None:
    """The discovery reads every shard, each shard's part whole on its node: no subplan."""
    for name in sorted(DISCOVERY):
        q = _db.QUERIES[name]
        plan = await _plan(conn, q, uuid.uuid4())
        assert "Subplan" not in plan, (name, plan)
        assert "Task Count: 32" in plan, (name, plan)


async def test_the_claims_read_their_tenant_by_a_tenant_leading_index(
    citus: Cluster, conn: asyncpg.Connection
) -> None:
    """On a shard holding many tenants, the claim's expired leases and the relay's due
    messages are read by an index that leads with the tenant (0014.citus_scale), not by
    time across every tenant of the shard. Sequential scans off, so the planner shows
    which index can answer at all."""
    t = await tenancy.create_tenant(conn, f"ct-{uuid.uuid4().hex[:8]}")
    async with conn.transaction():
        await conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        await conn.execute("SET LOCAL enable_seqscan = off")
        claim = await _plan(conn, _db.QUERIES["routed_claim"], t)
        relay = await _plan(conn, _db.QUERIES["routed_outbox_claim"], t)
    expired = claim[claim.index("CTE expired") : claim.index("CTE fresh")]
    assert "agent_tasks_lease_expiry_idx" in expired, expired
    assert "Index Cond: ((tenant_id = " in expired, expired
    due = relay[relay.index("CTE due") :]
    assert "agent_outbox_pending_idx" in due, due
    assert "Index Cond: ((tenant_id = " in due, due


async def test_a_claim_under_load_costs_few_remote_commands(citus: Cluster) -> None:
    """Four loops drain 200 tasks of twelve tenants by claims of one: the commands the
    coordinator sends the workers for the claims that found work, per task claimed, stay
    small (the discovery is kept for the claims of the next second), with no two-phase
    commit. Measured before: 36 for a claim of one task, 68 for the next."""
    n = 200
    setup = await _db.connect(citus.dsn)
    try:
        ids = [await tenancy.create_tenant(setup, f"ct-{uuid.uuid4().hex[:8]}") for _ in range(12)]
        for i in range(n):
            await tasks.create(setup, ids[i % 12], "remote-count")
    finally:
        await setup.close()
    counted: list[int] = []
    claimed = 0
    prepared = 0

    async def loop(me: str) -> None:
        nonlocal claimed, prepared
        conn = await _db.connect(citus.dsn)
        sent: list[str] = []
        conn.add_log_listener(lambda _c, m: sent.append(str(m.message)))
        await conn.execute("SET citus.log_remote_commands = on")
        after: uuid.UUID | None = None
        try:
            while True:
                before = len(sent)
                got = await leases.claim(conn, me, task_types=["remote-count"], after_tenant=after)
                if not got:
                    break
                # The notices of a statement arrive before its reply.
                mine = [c for c in sent[before:] if c.startswith("issuing ")]
                counted.append(len(mine))
                prepared += sum("PREPARE TRANSACTION" in c for c in mine)
                claimed += len(got)
                after = got[-1].tenant_id
        finally:
            await conn.close()

    routed._RINGS.clear()
    await asyncio.gather(*(loop(f"w{i}") for i in range(4)))
    assert claimed == n
    assert prepared == 0
    # One per claim (the call of agentdb_routed_claim, sent whole to the tenant's node:
    # 0021.delegated_writes; four before it - BEGIN, the claim, its event, COMMIT), and
    # the discoveries (32 shards each): one on each loop's first claim, one a second
    # after, one when a ring ran dry.
    per_task = sum(counted) / claimed
    print(f"remote commands per claimed task: {per_task:.2f}")
    assert per_task <= 6, (per_task, counted)
    assert min(counted) >= 1  # the commands were heard at all
    assert counted.count(1) >= claimed // 2, counted  # most claims: the one call alone


def test_the_citus_bench_runs_through_the_coordinator_and_on_the_nodes(citus: Cluster) -> None:
    """`agentdb bench`'s Citus section at a small size: every worker count on plain
    Postgres, on Citus through the coordinator and on the worker nodes, the remote
    commands counted (none of them PREPARE TRANSACTION) and the section rendered."""
    from agentdb.tools._signals import run_async
    from agentdb.tools.bench.citus import bench_citus, citus_database, citus_workers, node_urls
    from agentdb.tools.bench.harness import Databases, migrate_locked
    from agentdb.tools.bench.report import _citus_section

    dbs = Databases(citus.dsn, uuid.uuid4().hex[:8])
    try:
        plain = dbs.create(dbs.name("plain"))
        migrate_locked(citus.dsn, plain.url)
        workers = citus_workers(citus.dsn)
        with citus_database(dbs, workers) as url:
            nodes = node_urls(url, workers)
            found = run_async(lambda: bench_citus(url, plain.url, 40, 1, nodes))
    finally:
        dbs.drop_all()
    found["nodes"] = len(workers) + 1
    assert set(found["tasks_per_s"]) == {"plain", "citus", "citus_nodes"}
    for kind in found["tasks_per_s"].values():
        assert set(kind) == {"1", "2", "4"}
        assert all(v[0] > 0 for v in kind.values())
    rc = found["remote_commands"]
    assert rc["prepare_transaction"] == 0
    assert 1 <= rc["claim_per_task"] <= 40  # counted at all; small runs pay the discovery
    assert rc["finish_per_task"] == 1  # the transition's one delegated call
    text = "\n".join(_citus_section({"citus": found}))
    assert "on the worker nodes, tasks/s" in text
    assert "Remote commands the coordinator sent the workers per finished task" in text
