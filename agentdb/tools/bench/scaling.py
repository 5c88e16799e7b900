"""Scaling: claim latency (p50 / p99) with a small and a large task table, and the claim's plan."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any, LiteralString

from agentdb import _db, leases, tenancy
from agentdb.tools.bench.harness import HOUR, Database, Sizes, percentile, seed_tasks

__all__ = ["bench_scaling", "bench_tenant_scaling"]

# The plan of the very statement leases.claim runs, so the prefix is joined to
# its text: EXPLAIN takes no statement as a parameter, and a copy of the claim
# in a second file could drift from it. Both halves are static (a literal and
# a statement loaded from agentdb/queries), never built from values.
_EXPLAIN_CLAIM: LiteralString = (
    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + _db.QUERIES["lease_claim"].sql
)
_WARM_CLAIMS = 20


async def _seed_large(url: str, n: int) -> None:
    """Seed ``n`` pending tasks (with their events) on two connections in parallel."""
    conns = [await _db.connect(url) for _ in range(2)]
    try:
        tenant = await tenancy.create_tenant(conns[0], f"bench-scaling-{uuid.uuid4().hex[:8]}")
        half = n // 2
        await asyncio.gather(
            seed_tasks(conns[0], tenant, "scale", half),
            seed_tasks(conns[1], tenant, "scale", n - half),
        )
        # Fresh statistics and visibility map, so autovacuum does not start
        # in the middle of the measurement and the planner sees the real size.
        await conns[0].execute("VACUUM (ANALYZE) agent_tasks")
        await conns[0].execute("VACUUM (ANALYZE) agent_events")
    finally:
        for c in conns:
            await c.close()


async def _latencies(conn: _db.Conn, claims: int) -> list[float]:
    """Milliseconds per ``leases.claim(batch=1)``, ``claims`` times in a row.

    Raises:
        RuntimeError: a claim found no due task (the table was seeded too small).
    """
    lat: list[float] = []
    for _ in range(claims):
        t0 = time.perf_counter()
        got = await leases.claim(conn, "scale", lease_ttl=HOUR)
        lat.append((time.perf_counter() - t0) * 1000)
        if len(got) != 1:
            raise RuntimeError("the scaling queue ran dry")
    return lat


async def _explain_claim(conn: _db.Conn) -> str:
    """The claim's plan, from a run that is rolled back (EXPLAIN ANALYZE executes it)."""
    q = _db.QUERIES["lease_claim"]
    args = q.bind(
        {
            "lease_owner": "explain", "batch": 1, "lease_ttl": HOUR, "task_types": None,
            "after_tenant": None,
        }
    )  # fmt: skip
    tr = conn.transaction()
    await tr.start()
    try:
        return "\n".join(r[0] for r in await conn.fetch(_EXPLAIN_CLAIM, *args))
    finally:
        await tr.rollback()


async def bench_scaling(dbs: Mapping[int, Database], sizes: Sizes, reps: int) -> dict[str, Any]:
    """Seed each database of ``dbs`` with its number of tasks, then time claims on each in turn.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`.
        RuntimeError: a table ran out of due tasks.
    """
    for n, db in dbs.items():
        await _seed_large(db.url, n)
    conns = {n: await _db.connect(db.url) for n, db in dbs.items()}
    try:
        for c in conns.values():  # prepare the statement and warm the cache
            for _ in range(_WARM_CLAIMS):
                await leases.claim(c, "warm-up", lease_ttl=HOUR)
        p50: dict[int, list[float]] = {n: [] for n in dbs}
        p99: dict[int, list[float]] = {n: [] for n in dbs}
        for _ in range(reps):
            for n, c in conns.items():
                lat = await _latencies(c, sizes.scale_claims)
                p50[n].append(percentile(lat, 50))
                p99[n].append(percentile(lat, 99))
        large = max(conns)
        plan = await _explain_claim(conns[large])
        return {
            "sizes": sorted(dbs),
            "claims_per_rep": sizes.scale_claims,
            "p50_ms": {str(n): v for n, v in p50.items()},
            "p99_ms": {str(n): v for n, v in p99.items()},
            "explain_rows": large,
            "explain": plan,
            "index_path": "agent_tasks_due_idx" in plan and "Seq Scan on agent_tasks" not in plan,
        }
    finally:
        for c in conns.values():
            await c.close()


# Many tenants at once, each born with its tasks and their creation events in
# one statement (the deferred event trigger demands the events, G8).
_SEED_TENANTS: LiteralString = """
WITH tn AS (
    INSERT INTO agent_tenants (id, name)
    SELECT gen_random_uuid(), 'bench-tenant-' || g || '-' || gen_random_uuid()
    FROM generate_series(1, $1) AS g
    RETURNING id
), t AS (
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, params)
    SELECT tn.id, 'scale', '1', jsonb_build_object('n', g)
    FROM tn, generate_series(1, $2) AS g
    RETURNING tenant_id, id, workflow_version, state, state_version
)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                          to_state, task_state_version)
SELECT tenant_id, id, 'task.created', 'bench', workflow_version, state, state_version FROM t
"""


async def bench_tenant_scaling(
    dbs: Mapping[int, Database], sizes: Sizes, reps: int
) -> dict[str, Any]:
    """The same backlog spread over few and over many tenants; claims rotate as a worker's do.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`.
        RuntimeError: a table ran out of due tasks.
    """
    conns = {n: await _db.connect(db.url) for n, db in dbs.items()}
    try:
        for n, c in conns.items():
            await c.execute(_SEED_TENANTS, n, max(1, sizes.tenant_tasks // n))
            await c.execute("VACUUM (ANALYZE) agent_tasks")
        after: dict[int, uuid.UUID | None] = dict.fromkeys(conns)

        async def timed(n: int, c: _db.Conn, claims: int) -> list[float]:
            lat: list[float] = []
            for _ in range(claims):
                t0 = time.perf_counter()
                got = await leases.claim(c, "scale", lease_ttl=HOUR, after_tenant=after[n])
                lat.append((time.perf_counter() - t0) * 1000)
                if len(got) != 1:
                    raise RuntimeError("the tenant-scaling queue ran dry")
                after[n] = got[-1].tenant_id
            return lat

        for n, c in conns.items():
            await timed(n, c, _WARM_CLAIMS)
        p50: dict[int, list[float]] = {n: [] for n in dbs}
        for _ in range(reps):
            for n, c in conns.items():
                p50[n].append(percentile(await timed(n, c, sizes.scale_claims), 50))
        large = max(conns)
        plan = await _explain_claim(conns[large])
        return {
            "tenants": sorted(dbs),
            "tasks": sizes.tenant_tasks,
            "claims_per_rep": sizes.scale_claims,
            "p50_ms": {str(n): v for n, v in p50.items()},
            "explain": plan,
            "index_path": "agent_tasks_due_idx" in plan and "Seq Scan on agent_tasks" not in plan,
        }
    finally:
        for c in conns.values():
            await c.close()
