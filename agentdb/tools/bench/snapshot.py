"""Throughput under a held snapshot: the cycle at a fixed offered rate, with and without one.

A producer creates tasks at a fixed rate (a chunk every 100 ms: a quarter of
what the batched cycle drained in the task-cycle section); four
workers drain them with the batched full cycle (claim 10 after the tenant of
the last task, as the ``Worker`` does, ``reserve_many``,
``complete_many``, ``finish_many`` with an outbox row). Each run lasts the
same time (after an untimed warm-up), first with nothing else open, then
while another connection to
the same database holds a REPEATABLE READ snapshot taken as the run starts -
a forgotten transaction, a long report - so that neither page pruning nor
vacuum may remove any row version the cycle replaces, and the claim's index
scan walks past every one of them. Reported per run: tasks finished per
second, claim latency (p50, p99), backlog left at the end, and the dead row
versions and size of the three tables the cycle rewrites. The producer
shares the machine and may itself fall short of the rate, so each run's
throughput is taken against what arrived (``kept_up``: finished ÷ created in
the window) and the held run's loss is ``1 - its kept_up ÷ the free run's``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, LiteralString

from agentdb import _db, leases, tenancy
from agentdb.tools.bench.cycle import batched_steps
from agentdb.tools.bench.harness import HOUR, Cycle, Database, median, percentile, seed_tasks

__all__ = ["bench_snapshot", "offered_rate"]

_WORKERS = 4
_BATCH = 10
_TICK = 0.1  # seconds between the producer's chunks
_WARM = 5.0  # seconds of untimed warm-up before the free run
_TABLES = ("agent_tasks", "agent_operations", "agent_outbox")
# The dead row versions and the size (heap + indexes) of what the cycle rewrites.
_BLOAT: LiteralString = (
    "SELECT relname, n_dead_tup, pg_total_relation_size(relid) AS bytes"
    " FROM pg_stat_user_tables WHERE relname = ANY($1::text[])"
)
# The statistics other backends have not reported yet (PG 15+: at most a second late).
_SETTLE_STATS = 1.5


async def _bloat(conn: _db.Conn) -> dict[str, dict[str, int]]:
    await asyncio.sleep(_SETTLE_STATS)
    rows = await conn.fetch(_BLOAT, list(_TABLES))
    return {r["relname"]: {"dead": int(r["n_dead_tup"]), "bytes": int(r["bytes"])} for r in rows}


async def _run(
    db: Database,
    pool: _db.Pool,
    tenant: uuid.UUID,
    seconds: float,
    rate: float,
    *,
    held: bool,
    task_type: str | None = None,
) -> dict[str, Any]:
    task_type = task_type or f"snapshot-{'held' if held else 'free'}"
    conns = [await _db.connect(db.url) for _ in range(_WORKERS)]
    holder = await _db.connect(db.url)
    try:
        before = await _bloat(holder)
        if held:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM agent_tasks")  # the snapshot is taken
        claims_ms: list[float] = []
        result = Cycle(0)
        created = 0
        stop = asyncio.Event()

        async def produce() -> None:
            nonlocal created
            owed = 0.0
            next_at = time.perf_counter()
            while not stop.is_set():
                owed += rate * _TICK
                if (n := int(owed)) > 0:
                    await seed_tasks(pool, tenant, task_type, n)
                    created, owed = created + n, owed - n
                next_at += _TICK
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

        async def work(conn: _db.Conn, owner: str) -> None:
            # As agentdb.worker.Worker claims: after the tenant of its last task (G18).
            # Without it the walk also probes from the index's start, and under a held
            # snapshot that probe walks the dead entries once more per claim.
            after: uuid.UUID | None = None
            while not stop.is_set():
                t0 = time.perf_counter()
                claimed = await leases.claim(
                    conn, owner, batch=_BATCH, lease_ttl=HOUR, task_types=[task_type],
                    after_tenant=after,
                )  # fmt: skip
                claims_ms.append((time.perf_counter() - t0) * 1000)
                if claimed:
                    after = claimed[-1].tenant_id
                    await batched_steps(conn, claimed, result)
                else:
                    await asyncio.sleep(0.02)

        runners = [asyncio.create_task(produce())]
        runners += [asyncio.create_task(work(c, f"snap-{i}")) for i, c in enumerate(conns)]
        await asyncio.sleep(seconds)
        done = result.done  # finished within the window
        stop.set()
        await asyncio.gather(*runners)
        after = await _bloat(holder)
        if held:
            await holder.execute("ROLLBACK")
    finally:
        for c in (*conns, holder):
            await c.close()
    return {
        "held": held,
        "seconds": seconds,
        "offered_per_s": rate,
        "created": created,
        "created_per_s": created / seconds,
        "tasks_per_s": done / seconds,
        # What share of what arrived was finished in the window: the producer, on the same
        # machine, may itself fall short of the rate, so throughput is measured against it.
        "kept_up": done / created if created else 0.0,
        "backlog": created - result.done,
        "claim_p50_ms": percentile(claims_ms, 50),
        "claim_p99_ms": percentile(claims_ms, 99),
        "dead_rows": {t: after[t]["dead"] for t in _TABLES},
        "dead_rows_added": {t: after[t]["dead"] - before[t]["dead"] for t in _TABLES},
        "bytes_added": {t: after[t]["bytes"] - before[t]["bytes"] for t in _TABLES},
    }


def offered_rate(cycle: list[dict[str, Any]]) -> float:
    """A quarter of what the batched cycle (batch 10, 4 workers) drained from a seeded
    queue: a load the cycle keeps up with while the producer shares the machine."""
    for row in cycle:
        kind = (row["kind"], row["batch"], row["workers"])
        if kind == ("agentdb-batched", 10, 4) and row["tasks_per_s"]:
            return max(10.0, median(row["tasks_per_s"]) / 4)
    return 100.0


async def bench_snapshot(db: Database, seconds: float, rate: float) -> dict[str, Any]:
    """The free run, then the held one, each ``seconds`` long at ``rate`` tasks/s offered.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`; whatever the cycle raises.
    """
    pool = await _db.create_pool(db.url, min_size=1, max_size=2)
    try:
        tenant = await tenancy.create_tenant(pool, f"bench-snapshot-{uuid.uuid4().hex[:8]}")
        # Untimed: caches, plans and the tables' first pages warm for both runs alike.
        await _run(db, pool, tenant, min(seconds, _WARM), rate, held=False, task_type="warm")
        free = await _run(db, pool, tenant, seconds, rate, held=False)
        held = await _run(db, pool, tenant, seconds, rate, held=True)
    finally:
        await pool.close()
    loss = 1 - held["kept_up"] / free["kept_up"] if free["kept_up"] else None
    return {"free": free, "held": held, "loss_pct": None if loss is None else loss * 100}
