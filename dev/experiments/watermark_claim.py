"""Prototype: a claim that starts from a per-(tenant, task type) watermark (issue 41, item 3).

What it measures
----------------
``agentdb bench``'s held-snapshot section (agentdb/tools/bench/snapshot.py)
loses throughput while another connection holds a REPEATABLE READ snapshot:
``lease_claim`` walks ``agent_tasks_due_idx`` (tenant_id, task_type, wake_at)
from each pair's head, where every task claimed since the snapshot leaves a
pending version's entry that cannot be killed, so each claim pays
O(claimed since the snapshot) heap fetches.

This script builds the alternative the issue names - a claim that starts from
a per-pair watermark, with a periodic full walk - and measures it against the
current claim, on a fresh migrated database (``wm_exp_<hex>``, dropped at the
end):

1. ``explain``: N tasks claimed under a held snapshot, then EXPLAIN (ANALYZE,
   BUFFERS) of one claim (batch 10, rolled back) in three forms: the current
   statement as the bench calls it (after_tenant NULL), the current statement
   with after_tenant = the tenant (as agentdb.worker.Worker calls it), and the
   watermark statement. Read ``buffers`` (shared hit+read of the top plan
   node) and ``ms``.
2. ``late``: a deterministic check of what the watermark skips. One worker
   per design, a trickle of tasks, and three kinds of probe task, three of
   each: ``late`` (created in a transaction that commits 3 s after it began,
   so its wake_at = its transaction's start is older than the watermark),
   ``new_tenant`` (the first task of a tenant the worker has never seen) and
   ``fresh`` (an ordinary task of the known pair: the control). Read, per
   probe, the seconds from its commit to its claim and which kind of claim
   took it (``full`` = the periodic full walk, ``mark`` = the watermark claim,
   ``current`` = the current statement).
3. ``runs``: the bench's held-snapshot run (copied from snapshot._run and
   adapted), four variants interleaved per round: current free, watermark
   free, current held, watermark held, each ``--seconds`` long at the same
   offered rate. Between runs the backlog is drained and the tables vacuumed,
   so every run starts from the same state. Read per run: tasks_per_s,
   kept_up (finished / created in the window), claim p50/p99 over all claims
   and, for the watermark design, separately for its full claims and its
   watermark claims, dead task row versions added; and per design
   ``loss_pct`` = 1 - held kept_up / free kept_up (the issue's target: <= 15).

The prototype worker (``_Marks``): after every claim, each pair it got tasks
of gets watermark = max(old watermark, smallest wake_at claimed - margin).
Every ``--period`` seconds (staggered over the workers) and while it knows no
pair it makes a full claim with the current statement (``leases.claim``),
which finds pairs it does not know and catches what the watermark skipped;
otherwise it runs the watermark statement over the pairs it knows.

Run (2 cores shared: the runs are interleaved, compare the ratios)::

    .venv/bin/python -m dev.experiments.watermark_claim \
        --dsn postgresql://postgres@127.0.0.1:5432/postgres --seconds 60

The timed runs' worker sessions use plan_cache_mode = force_generic_plan for both
designs (``--plan-cache-mode ''`` for the server's setting): under ``auto`` the prototype
statement is replanned at every call (3-5 ms), which hides what it reads. The
``index_entries_per_claim`` of a run (idx_tup_read per claim call) says which index walk
the dead entries land in: agent_tasks_due_idx (the walk and the take, what the watermark
removes) or agent_tasks_running_idx (the ``expired`` CTE, when it is planned as a full
scan of that index, which the watermark does not touch).

Output: one JSON document on stdout (also written to ``--out`` if given),
plus a one-line-per-run summary on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, LiteralString

from agentdb import _db, leases, tenancy
from agentdb._db.sqlfile import parse
from agentdb.models import Task
from agentdb.tools.bench.cycle import batched_steps
from agentdb.tools.bench.harness import (
    HOUR,
    Cycle,
    Database,
    Databases,
    migrate_locked,
    percentile,
    seed_tasks,
)
from agentdb.tools.bench.snapshot import _BATCH, _TABLES, _TICK, _WORKERS, _bloat

# --- The prototype statement -------------------------------------------------
#
# lease_claim (agentdb/queries/leases.sql) with three more parameters: the
# pairs the worker knows and a watermark for each. The walk goes over those
# pairs only (in tenant order, starting after $5, as lease_claim's walk) and
# each pair's probe, and the take, start at (tenant_id, task_type, wake_at) >=
# (tenant, type, watermark): equality on the two leading columns and a lower
# bound on the third, a btree start key past the entries of the tasks claimed
# before the watermark. Pairs the worker does not know are not walked: the
# periodic full claim (the current statement) finds them. From ``due_pairs`` on
# the statement is lease_claim's, with the watermark added to the take.
WATERMARK_CLAIM: LiteralString = """-- name: lease_claim_watermark :many
-- Prototype (dev/experiments/watermark_claim.py): lease_claim over the pairs in $6/$7, each walked
-- and taken from its watermark $8 on.
-- guarantee: G18, G12, G7, G8
-- params: $1 lease_owner text, $2 batch int4, $3 lease_ttl interval, $4 task_types text[],
-- params: $5 after_tenant uuid, $6 mark_tenants uuid[], $7 mark_types text[],
-- params: $8 marks timestamptz[]
WITH RECURSIVE marks AS (
    SELECT m.tenant_id, m.task_type, m.mark,
           row_number() OVER (
               ORDER BY m.tenant_id <= coalesce($5, '00000000-0000-0000-0000-000000000000'::uuid),
                        m.tenant_id, m.task_type) AS ord
    FROM unnest($6::uuid[], $7::text[], $8::timestamptz[]) AS m (tenant_id, task_type, mark)
    WHERE $4::text[] IS NULL OR m.task_type = ANY ($4)
), walk (step, tenant_id, task_type, mark, takeable, found, last_due) AS (
    SELECT 1, m.tenant_id, m.task_type, m.mark, f.takeable,
           CASE WHEN f.takeable THEN 1 ELSE 0 END,
           CASE WHEN f.takeable THEN m.tenant_id END
    FROM marks m
    -- The pair's first entry from its watermark on (a LIMIT subquery: planned once, not
    -- copied into each use of takeable).
    LEFT JOIN LATERAL (
        SELECT t.wake_at AS head
        FROM agent_tasks t
        WHERE t.tenant_id = m.tenant_id AND t.task_type = m.task_type
          AND t.state IN ('pending', 'waiting') AND t.wake_at >= m.mark
          AND t.attempts < t.max_attempts AND (t.deadline_at IS NULL OR t.deadline_at > now())
        ORDER BY t.wake_at
        LIMIT 1
    ) h ON true
    CROSS JOIN LATERAL (
        SELECT coalesce(h.head <= now(), false)
               AND NOT EXISTS (
                   SELECT 1 FROM agent_concurrency_limits l
                   WHERE l.tenant_id = m.tenant_id AND l.task_type IN ('*', m.task_type)
                     AND l.max_running <= (
                         SELECT count(*) FROM agent_tasks r
                         WHERE r.tenant_id = l.tenant_id AND r.state = 'running'
                           AND (l.task_type = '*' OR r.task_type = l.task_type))) AS takeable
    ) f
    WHERE m.ord = 1
    UNION ALL
    SELECT w.step + 1, m.tenant_id, m.task_type, m.mark, f.takeable,
           w.found + CASE WHEN f.takeable AND m.tenant_id IS DISTINCT FROM w.last_due
                          THEN 1 ELSE 0 END,
           CASE WHEN f.takeable THEN m.tenant_id ELSE w.last_due END
    FROM walk w
    JOIN marks m ON m.ord = w.step + 1
    -- The pair's first entry from its watermark on (a LIMIT subquery: planned once, not
    -- copied into each use of takeable).
    LEFT JOIN LATERAL (
        SELECT t.wake_at AS head
        FROM agent_tasks t
        WHERE t.tenant_id = m.tenant_id AND t.task_type = m.task_type
          AND t.state IN ('pending', 'waiting') AND t.wake_at >= m.mark
          AND t.attempts < t.max_attempts AND (t.deadline_at IS NULL OR t.deadline_at > now())
        ORDER BY t.wake_at
        LIMIT 1
    ) h ON true
    CROSS JOIN LATERAL (
        SELECT coalesce(h.head <= now(), false)
               AND NOT EXISTS (
                   SELECT 1 FROM agent_concurrency_limits l
                   WHERE l.tenant_id = m.tenant_id AND l.task_type IN ('*', m.task_type)
                     AND l.max_running <= (
                         SELECT count(*) FROM agent_tasks r
                         WHERE r.tenant_id = l.tenant_id AND r.state = 'running'
                           AND (l.task_type = '*' OR r.task_type = l.task_type))) AS takeable
    ) f
    -- Go on until enough tenants (finishing the last one's task types), or the pairs run out.
    WHERE w.found < $2 OR m.tenant_id = w.tenant_id
), due_pairs AS (
    SELECT tenant_id, task_type, mark, step FROM walk WHERE takeable
), due AS (
    SELECT tenant_id, min(step) AS step
    FROM due_pairs
    GROUP BY tenant_id
    ORDER BY min(step)
    LIMIT $2
), caps AS (
    SELECT l.tenant_id, l.task_type, l.max_running
    FROM agent_concurrency_limits l
    WHERE l.tenant_id IN (SELECT tenant_id FROM due) AND l.max_running IS NOT NULL
    ORDER BY l.tenant_id, l.task_type
    FOR UPDATE SKIP LOCKED
), free AS (
    SELECT c.tenant_id, c.task_type,
           c.max_running - agentdb_running_count(c.tenant_id, c.task_type) AS slots
    FROM caps c
), held_elsewhere AS (
    SELECT l.tenant_id
    FROM agent_concurrency_limits l
    WHERE l.tenant_id IN (SELECT tenant_id FROM due) AND l.max_running IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM caps c
                      WHERE c.tenant_id = l.tenant_id AND c.task_type = l.task_type)
), share AS (
    SELECT d.tenant_id, d.step,
           greatest(0, least((SELECT ($2 + count(*) - 1) / count(*) FROM due),
                             (SELECT f.slots FROM free f
                              WHERE f.tenant_id = d.tenant_id AND f.task_type = '*'))) AS n
    FROM due d
    WHERE d.tenant_id NOT IN (SELECT tenant_id FROM held_elsewhere)
), offered AS (
    SELECT o.tenant_id, o.id, o.task_type, o.wake_at, o.from_state, s.step
    FROM share s
    JOIN due_pairs p ON p.tenant_id = s.tenant_id
    CROSS JOIN LATERAL (
        SELECT t.tenant_id, t.id, t.task_type, t.wake_at, t.state AS from_state
        FROM agent_tasks t
        WHERE t.tenant_id = p.tenant_id AND t.task_type = p.task_type
          AND t.state IN ('pending', 'waiting') AND t.wake_at <= now()
          AND t.wake_at >= p.mark
          AND t.attempts < t.max_attempts
          AND (t.deadline_at IS NULL OR t.deadline_at > now())
        ORDER BY t.wake_at
        LIMIT least(s.n, (SELECT greatest(0, f.slots) FROM free f
                          WHERE f.tenant_id = p.tenant_id AND f.task_type = p.task_type))
        FOR UPDATE SKIP LOCKED
    ) o
), ranked AS (
    SELECT o.tenant_id, o.id, o.from_state, o.step,
           row_number() OVER (PARTITION BY o.tenant_id ORDER BY o.wake_at, o.id) AS nth
    FROM offered o
), expired AS (
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE state = 'running' AND lease_expires_at <= now() AND attempts < max_attempts
      AND ($4::text[] IS NULL OR task_type = ANY ($4))
      AND (deadline_at IS NULL OR deadline_at > now())
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT tenant_id, id, from_state, ord
    FROM ((SELECT tenant_id, id, from_state, 0::int8 AS ord FROM expired)
          UNION ALL
          (SELECT r.tenant_id, r.id, r.from_state, row_number() OVER (ORDER BY r.nth, r.step)
           FROM ranked r JOIN share s ON s.tenant_id = r.tenant_id
           WHERE r.nth <= s.n)) p
    ORDER BY ord
    LIMIT $2
), claimed AS (
    UPDATE agent_tasks t
    SET state = 'running',
        state_version = t.state_version + 1,
        lease_owner = $1,
        lease_token = t.lease_token + 1,
        lease_acquired_at = now(),
        lease_expires_at = now() + coalesce($3, t.lease_ttl),
        attempts = t.attempts + 1,
        updated_at = now()
    FROM picked p
    WHERE t.tenant_id = p.tenant_id AND t.id = p.id
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id,
              t.created_at, t.updated_at, p.from_state, p.ord
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id,
           CASE WHEN from_state = 'running' THEN 'task.reclaimed' ELSE 'task.claimed' END,
           lease_owner, workflow_version, from_state, state, state_version,
           jsonb_build_object('lease_token', lease_token, 'attempt', attempts),
           trace_id, span_id
    FROM claimed
)
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM claimed
ORDER BY ord;
"""
# Parsed by agentdb's own loader: its header is checked as a statement file's would be.
_WQ = parse(WATERMARK_CLAIM, "dev/experiments/watermark_claim.py")[0]
_EXPLAIN_WATERMARK: LiteralString = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + _WQ.sql
_EXPLAIN_CURRENT: LiteralString = (
    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + _db.QUERIES["lease_claim"].sql
)

Pair = tuple[uuid.UUID, str]


async def claim_watermark(
    conn: _db.Conn,
    owner: str,
    marks: dict[Pair, datetime],
    *,
    batch: int,
    lease_ttl: timedelta | None,
    task_types: list[str] | None,
    after_tenant: uuid.UUID | None,
) -> list[Task]:
    """The prototype claim over the pairs in ``marks`` (looked at once more when empty,
    as leases.claim does)."""
    pairs = sorted(marks)
    args = {
        "lease_owner": owner,
        "batch": batch,
        "lease_ttl": lease_ttl,
        "task_types": task_types,
        "after_tenant": after_tenant,
        "mark_tenants": [p[0] for p in pairs],
        "mark_types": [p[1] for p in pairs],
        "marks": [marks[p] for p in pairs],
    }
    rows = await _db.fetch_many(conn, _WQ, **args)
    if not rows:
        rows = await _db.fetch_many(conn, _WQ, **args)
    return [Task.from_record(r) for r in rows]


class _Marks:
    """One worker's watermarks and full-walk schedule.

    Watermark of a pair = max(its old one, smallest wake_at of the pair's tasks this claim
    got - margin). The take is ORDER BY wake_at ... FOR UPDATE SKIP LOCKED, so what the
    claim got is a prefix of the pair's due entries (from the old watermark on) that were
    visible and not locked: every entry below its smallest wake_at was already gone
    (claimed), locked by another claimer, or not yet visible (committed after the
    claim's snapshot). The largest wake_at would do as well in the bench (the entries
    between smallest and largest are the ones this claim took, or locked by others);
    the smallest is the conservative choice and differs by one batch's spread of
    wake_at (~40 ms at 250 tasks/s), nothing beside the margin. The margin covers
    creating transactions that commit up to ``margin`` after they began (wake_at
    defaults to now(), the transaction's start). What falls below anyway (a later
    commit, a task released or created with an old wake_at, a row a claimer locked
    and then did not take) waits for the full walk.
    """

    def __init__(self, margin: float, period: float, offset: float) -> None:
        self.margin = timedelta(seconds=margin)
        self.period = period
        self.marks: dict[Pair, datetime] = {}
        self.next_full = time.perf_counter() + offset

    def full_due(self, now: float) -> bool:
        return not self.marks or now >= self.next_full

    def full_done(self, now: float) -> None:
        if now >= self.next_full:
            self.next_full = now + self.period

    def update(self, claimed: list[Task]) -> None:
        low: dict[Pair, datetime] = {}
        for t in claimed:
            if t.wake_at is None:
                continue
            pair = (t.tenant_id, t.task_type)
            low[pair] = min(low.get(pair, t.wake_at), t.wake_at)
        for pair, w in low.items():
            mark = w - self.margin
            self.marks[pair] = max(self.marks.get(pair, mark), mark)


# on_claim(kind, milliseconds, tasks): kind is "current", "full" or "mark".
OnClaim = Callable[[str, float, list[Task]], None]


async def worker_loop(
    conn: _db.Conn,
    owner: str,
    index: int,
    design: str,
    task_type: str,
    stop: asyncio.Event,
    result: Cycle,
    on_claim: OnClaim,
    *,
    period: float,
    margin: float,
    workers: int,
) -> None:
    """snapshot._run's worker, with the claim chosen by ``design`` ("current" or "watermark")."""
    marks = _Marks(margin, period, offset=(index + 1) * period / workers)
    last_tenant: uuid.UUID | None = None
    while not stop.is_set():
        t0 = time.perf_counter()
        if design == "current":
            kind = "current"
            claimed = await leases.claim(
                conn, owner, batch=_BATCH, lease_ttl=HOUR, task_types=[task_type]
            )
        elif marks.full_due(t0):
            kind = "full"  # exactly the current claim, as the bench calls it
            claimed = await leases.claim(
                conn, owner, batch=_BATCH, lease_ttl=HOUR, task_types=[task_type]
            )
            marks.full_done(t0)
        else:
            kind = "mark"
            claimed = await claim_watermark(
                conn, owner, marks.marks, batch=_BATCH, lease_ttl=HOUR,
                task_types=[task_type], after_tenant=last_tenant,
            )  # fmt: skip
        on_claim(kind, (time.perf_counter() - t0) * 1000, claimed)
        if claimed:
            marks.update(claimed)
            last_tenant = claimed[-1].tenant_id
            await batched_steps(conn, claimed, result)
        else:
            await asyncio.sleep(0.02)


def _lat(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
    }


# --- One timed run: snapshot._run, adapted ------------------------------------


# The session's plan_cache_mode on every worker connection of the timed runs, for both
# designs. With the default (auto) the prototype statement is replanned at every call
# (~3-5 ms here): its generic plan is costed above its custom plans, the parameter
# arrays' sizes being unknown, while lease_claim's generic plan wins and is kept.
# force_generic_plan puts both on a cached generic plan (lease_claim's own latency is
# unchanged by it); a shipped statement would need a generic plan the planner keeps.
PLAN_CACHE_MODE: str | None = "force_generic_plan"
_SET_PLAN_CACHE_MODE: LiteralString = "SELECT set_config('plan_cache_mode', $1, false)"

# Index entries the scans of each agent_tasks index returned (dead ones included: they
# come back from the index before the heap says they are invisible).
_INDEX_READS: LiteralString = (
    "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'agent_tasks'"
)
_WATCHED = ("agent_tasks_due_idx", "agent_tasks_running_idx", "agent_tasks_lease_expiry_idx")


async def _index_reads(conn: _db.Conn) -> dict[str, int]:
    return {r["indexrelname"]: int(r["idx_tup_read"]) for r in await conn.fetch(_INDEX_READS)}


async def _run(
    db: Database,
    pool: _db.Pool,
    tenant: uuid.UUID,
    seconds: float,
    rate: float,
    *,
    held: bool,
    design: str,
    task_type: str,
    period: float,
    margin: float,
) -> dict[str, Any]:
    conns = [await _db.connect(db.url) for _ in range(_WORKERS)]
    holder = await _db.connect(db.url)
    for c in conns:
        if PLAN_CACHE_MODE is not None:  # the same for both designs: see --plan-cache-mode
            await c.execute(_SET_PLAN_CACHE_MODE, PLAN_CACHE_MODE)
    try:
        before = await _bloat(holder)
        reads_before = await _index_reads(holder)
        if held:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM agent_tasks")  # the snapshot is taken
        claims: dict[str, list[float]] = {"current": [], "full": [], "mark": []}
        got: dict[str, int] = {"current": 0, "full": 0, "mark": 0}
        result = Cycle(0)
        created = 0
        stop = asyncio.Event()

        def on_claim(kind: str, ms: float, tasks: list[Task]) -> None:
            claims[kind].append(ms)
            got[kind] += len(tasks)

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

        runners = [asyncio.create_task(produce())]
        runners += [
            asyncio.create_task(
                worker_loop(
                    c, f"wm-{i}", i, design, task_type, stop, result, on_claim,
                    period=period, margin=margin, workers=_WORKERS,
                )
            )
            for i, c in enumerate(conns)
        ]  # fmt: skip
        await asyncio.sleep(seconds)
        done = result.done  # finished within the window
        stop.set()
        await asyncio.gather(*runners)
        after = await _bloat(holder)
        reads_after = await _index_reads(holder)
        if held:
            await holder.execute("ROLLBACK")
    finally:
        for c in (*conns, holder):
            await c.close()
    every = claims["current"] + claims["full"] + claims["mark"]
    return {
        "design": design,
        "held": held,
        "seconds": seconds,
        "offered_per_s": rate,
        "created": created,
        "created_per_s": round(created / seconds, 1),
        "tasks_per_s": round(done / seconds, 1),
        "kept_up": round(done / created, 4) if created else 0.0,
        "backlog": created - result.done,
        "claim_p50_ms": round(percentile(every, 50), 2),
        "claim_p99_ms": round(percentile(every, 99), 2),
        "claims": len(every),
        "full_claims": _lat(claims["full"]),
        "mark_claims": _lat(claims["mark"]),
        "tasks_by_full": got["full"],
        "tasks_by_mark": got["mark"],
        "dead_rows_added": {t: after[t]["dead"] - before[t]["dead"] for t in _TABLES},
        # Per claim statement (a claim that found nothing runs it twice: counted once).
        "index_entries_per_claim": {
            i: round((reads_after.get(i, 0) - reads_before.get(i, 0)) / max(1, len(every)), 1)
            for i in _WATCHED
        },
    }


async def _drain_and_vacuum(db: Database, task_type: str) -> int:
    """Finish what a run left (no snapshot held any more), then vacuum: the next run starts
    from the same state."""
    conn = await _db.connect(db.url)
    drained = Cycle(0)
    try:
        while claimed := await leases.claim(
            conn, "drain", batch=200, lease_ttl=HOUR, task_types=[task_type]
        ):
            await batched_steps(conn, claimed, drained)
        await conn.execute(
            "VACUUM (ANALYZE) agent_tasks, agent_operations, agent_outbox, agent_events"
        )
    finally:
        await conn.close()
    return drained.done


def _summary(r: dict[str, Any]) -> str:
    extra = ""
    if r["design"] == "watermark":
        f, m = r["full_claims"], r["mark_claims"]
        extra = (
            f" full n={f['n']} p50={f['p50_ms']} p99={f['p99_ms']}"
            f" | mark n={m['n']} p50={m['p50_ms']} p99={m['p99_ms']}"
            f" | tasks by full={r['tasks_by_full']} mark={r['tasks_by_mark']}"
        )
    return (
        f"{r['design']:9} {'held' if r['held'] else 'free'} {r['seconds']:.0f}s:"
        f" {r['tasks_per_s']}/s kept_up={r['kept_up']} backlog={r['backlog']}"
        f" claim p50={r['claim_p50_ms']} p99={r['claim_p99_ms']}"
        f" dead tasks+={r['dead_rows_added']['agent_tasks']}{extra}"
        f" | index entries/claim {r['index_entries_per_claim']}"
    )


async def runs(
    db: Database, seconds: float, rate: float, rounds: int, period: float, margin: float
) -> dict[str, Any]:
    """``rounds`` x (current free, watermark free, current held, watermark held)."""
    pool = await _db.create_pool(db.url, min_size=1, max_size=2)
    out: list[dict[str, Any]] = []
    try:
        tenant = await tenancy.create_tenant(pool, f"wm-exp-{uuid.uuid4().hex[:8]}")
        for design in ("current", "watermark"):  # untimed warm-up: caches, plans
            await _run(db, pool, tenant, 5.0, rate, held=False, design=design,
                       task_type=f"warm-{design}", period=period, margin=margin)  # fmt: skip
            await _drain_and_vacuum(db, f"warm-{design}")
        order = [("current", False), ("watermark", False), ("current", True), ("watermark", True)]
        for rnd in range(rounds):
            for design, held in order if rnd % 2 == 0 else order[::-1]:
                tt = f"{design}-{'held' if held else 'free'}-{rnd}"
                r = await _run(db, pool, tenant, seconds, rate, held=held, design=design,
                               task_type=tt, period=period, margin=margin)  # fmt: skip
                r["round"] = rnd
                r["load_after"] = os.getloadavg()
                r["drained_after"] = await _drain_and_vacuum(db, tt)
                print(_summary(r), f"load={r['load_after'][0]:.2f}", file=sys.stderr, flush=True)
                out.append(r)
    finally:
        await pool.close()
    loss: dict[str, list[float]] = {}
    for rnd in range(rounds):
        for design in ("current", "watermark"):
            k = {
                held: next(
                    r["kept_up"] for r in out
                    if r["round"] == rnd and r["design"] == design and r["held"] == held
                )
                for held in (False, True)
            }  # fmt: skip
            if k[False]:
                loss.setdefault(design, []).append(round((1 - k[True] / k[False]) * 100, 1))
    return {"runs": out, "loss_pct": loss}


# --- EXPLAIN under a held snapshot ---------------------------------------------

# seed_tasks with wake_at spread as a producer at 1/$4 tasks per second would leave it
# (a single INSERT gives all its rows one now()); each task with its creation event (G8).
_SEED_SPREAD: LiteralString = """
WITH t AS (
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, params, wake_at)
    SELECT $1, $2, '1', jsonb_build_object('n', g),
           now() - make_interval(secs => ($3 - g) * $4::float8)
    FROM generate_series(1, $3) AS g
    RETURNING tenant_id, id, workflow_version, state, state_version, trace_id, span_id
)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, to_state,
                          task_state_version, trace_id, span_id)
SELECT tenant_id, id, 'task.created', 'bench', workflow_version, state, state_version,
       trace_id, span_id
FROM t
"""
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")
_EXEC = re.compile(r"Execution Time: ([\d.]+) ms")


async def _explain(conn: _db.Conn, stmt: LiteralString, args: tuple[Any, ...]) -> dict[str, Any]:
    tr = conn.transaction()
    await tr.start()
    try:
        plan = "\n".join(r[0] for r in await conn.fetch(stmt, *args))
    finally:
        await tr.rollback()
    m = _BUFFERS.search(plan)
    e = _EXEC.search(plan)
    lines = plan.splitlines()
    parts: dict[str, int] = {}  # buffers of the CTEs that read agent_tasks
    for i, line in enumerate(lines):
        cte = re.match(r"\s*CTE (walk|offered|expired)$", line)
        if cte is not None:
            for nxt in lines[i + 1 : i + 12]:
                if (b := _BUFFERS.search(nxt)) is not None:
                    parts[cte.group(1)] = sum(int(x or 0) for x in b.groups())
                    break
    return {
        "buffers": sum(int(x or 0) for x in m.groups()) if m else None,
        "cte_buffers": parts,
        "ms": float(e.group(1)) if e else None,
        "plan": plan,
    }


async def explain_check(db: Database, claimed_n: int, margin: float) -> dict[str, Any]:
    """Claim ``claimed_n`` tasks under a held snapshot, then EXPLAIN one more claim each way."""
    conn = await _db.connect(db.url)
    holder = await _db.connect(db.url)
    try:
        tenant = await tenancy.create_tenant(conn, f"wm-explain-{uuid.uuid4().hex[:8]}")
        tt = "explain"
        await conn.execute(_SEED_SPREAD, tenant, tt, claimed_n + 2000, 0.004)  # 250 tasks/s
        await conn.execute("VACUUM (ANALYZE) agent_tasks")
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM agent_tasks")
        got: list[Task] = []
        while len(got) < claimed_n:
            batch = await leases.claim(
                conn, "explain", batch=min(500, claimed_n - len(got)), lease_ttl=HOUR,
                task_types=[tt],
            )  # fmt: skip
            await batched_steps(conn, batch, Cycle(0))  # finished, as in the bench
            got += batch
        last = got[-500:]  # the worker's last claim
        mark = min(t.wake_at for t in last if t.wake_at) - timedelta(seconds=margin)
        cur = _db.QUERIES["lease_claim"]
        base = {"lease_owner": "x", "batch": _BATCH, "lease_ttl": HOUR, "task_types": [tt]}
        out: dict[str, Any] = {"claimed_under_snapshot": len(got), "margin_s": margin}
        for _ in range(2):  # the second pass is reported (plans and caches warm)
            out["current_after_null"] = await _explain(
                conn, _EXPLAIN_CURRENT, cur.bind({**base, "after_tenant": None})
            )
            out["current_after_tenant"] = await _explain(
                conn, _EXPLAIN_CURRENT, cur.bind({**base, "after_tenant": tenant})
            )
            out["watermark"] = await _explain(
                conn, _EXPLAIN_WATERMARK,
                _WQ.bind({**base, "after_tenant": tenant, "mark_tenants": [tenant],
                          "mark_types": [tt], "marks": [mark]}),
            )  # fmt: skip
        await holder.execute("ROLLBACK")
        await conn.execute("VACUUM (ANALYZE) agent_tasks")
        return out
    finally:
        await holder.close()
        await conn.close()


# --- What the watermark skips: late commits, new tenants -------------------------


async def late_check(db: Database, design: str, period: float, margin: float) -> dict[str, Any]:
    """One worker, 50 tasks/s for a known pair, and probe tasks (``n`` < 0) at fixed times:
    late commits (3 s between the creating transaction's start and its commit), first
    tasks of new tenants, fresh tasks of the known pair. Report commit-to-claim seconds
    and the kind of claim that took each."""
    tt = f"late-{design}"
    pool = await _db.create_pool(db.url, min_size=1, max_size=4)
    conn = await _db.connect(db.url)
    tenant = await tenancy.create_tenant(pool, f"wm-late-{uuid.uuid4().hex[:8]}")
    committed: dict[int, tuple[str, float]] = {}
    taken: dict[int, tuple[str, float]] = {}
    stop = asyncio.Event()
    all_taken = asyncio.Event()

    def on_claim(kind: str, ms: float, tasks: list[Task]) -> None:
        now = time.perf_counter()
        for t in tasks:
            if (n := t.params["n"]) < 0:
                taken[n] = (kind, now)
        if len(taken) >= len(plan):
            all_taken.set()

    async def one(n: int, what: str, at: float, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        async with pool.acquire() as c:
            if what == "late":
                async with c.transaction():
                    await c.execute(_SEED_ONE, tenant, tt, n)
                    await asyncio.sleep(3.0)
            elif what == "new_tenant":
                other = await tenancy.create_tenant(c, f"wm-new-{uuid.uuid4().hex[:8]}")
                await c.execute(_SEED_ONE, other, tt, n)
            else:
                await c.execute(_SEED_ONE, tenant, tt, n)
        committed[n] = (what, time.perf_counter())

    async def produce() -> None:
        while not stop.is_set():
            await seed_tasks(pool, tenant, tt, 5)
            await asyncio.sleep(0.1)

    plan = [
        (-1, "late", 2.0), (-2, "new_tenant", 3.1), (-3, "fresh", 4.3),
        (-4, "late", 8.0), (-5, "new_tenant", 9.7), (-6, "fresh", 10.2),
        (-7, "late", 14.5), (-8, "new_tenant", 15.3), (-9, "fresh", 16.9),
    ]  # fmt: skip
    try:
        t0 = time.perf_counter()
        jobs = [asyncio.create_task(produce())]
        jobs.append(asyncio.create_task(worker_loop(
            conn, "late-0", 0, design, tt, stop, Cycle(0), on_claim,
            period=period, margin=margin, workers=1,
        )))  # fmt: skip
        await asyncio.gather(*(one(n, what, at, t0) for n, what, at in plan))
        with contextlib.suppress(TimeoutError):  # probes never taken are reported as such
            await asyncio.wait_for(all_taken.wait(), timeout=3 * period + 5)
        stop.set()
        await asyncio.gather(*jobs)
    finally:
        await conn.close()
        await pool.close()
    probes = []
    for n, what, _ in plan:
        kind, at = taken.get(n, ("never", float("nan")))
        probes.append({
            "probe": what, "n": n, "claimed_by": kind,
            "commit_to_claim_s": round(at - committed[n][1], 3),
        })  # fmt: skip
    return {"design": design, "period_s": period, "margin_s": margin, "probes": probes}


_SEED_ONE: LiteralString = """
WITH t AS (
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, params)
    VALUES ($1, $2, '1', jsonb_build_object('n', $3::int))
    RETURNING tenant_id, id, workflow_version, state, state_version, trace_id, span_id
)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, to_state,
                          task_state_version, trace_id, span_id)
SELECT tenant_id, id, 'task.created', 'bench', workflow_version, state, state_version,
       trace_id, span_id
FROM t
"""


# --- Command line -------------------------------------------------------------------


async def _main(opts: argparse.Namespace) -> dict[str, Any]:
    dbs = Databases(opts.dsn, secrets.token_hex(4))
    out: dict[str, Any] = {
        "args": vars(opts),
        "load_before": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    try:
        db = dbs.create(f"wm_exp_{dbs.tag}")
        await asyncio.to_thread(migrate_locked, opts.dsn, db.url)
        if opts.explain_tasks:
            out["explain"] = await explain_check(db, opts.explain_tasks, opts.margin)
            for k in ("current_after_null", "current_after_tenant", "watermark"):
                e = out["explain"][k]
                print(f"explain {k}: buffers={e['buffers']} {e['cte_buffers']} ms={e['ms']}",
                      file=sys.stderr)  # fmt: skip
        if opts.late_check:
            out["late"] = [
                await late_check(db, d, opts.period, opts.margin) for d in ("current", "watermark")
            ]
            for r in out["late"]:
                for p in r["probes"]:
                    print(f"late {r['design']}: {p}", file=sys.stderr)
        if opts.rounds:
            out.update(await runs(db, opts.seconds, opts.rate, opts.rounds, opts.period,
                                  opts.margin))  # fmt: skip
            print(f"loss_pct: {out['loss_pct']}", file=sys.stderr)
        out["load_after"] = os.getloadavg()
    finally:
        if not opts.keep_db:
            dbs.drop_all()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dev.experiments.watermark_claim",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--dsn", required=True, help="admin DSN (CREATE DATABASE wm_exp_<hex>)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each timed run")
    p.add_argument("--rate", type=float, default=250.0, help="tasks/s offered in every run")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the four runs (0: none)")
    p.add_argument("--period", type=float, default=2.0, help="seconds between full claims")
    p.add_argument("--margin", type=float, default=1.0, help="watermark margin, seconds")
    p.add_argument("--explain-tasks", type=int, default=20_000,
                   help="tasks claimed under the snapshot before EXPLAIN (0: skip)")  # fmt: skip
    p.add_argument("--no-late-check", dest="late_check", action="store_false")
    p.add_argument(
        "--plan-cache-mode",
        default="force_generic_plan",
        help="plan_cache_mode of the timed runs' worker sessions ('' = server's)",
    )
    p.add_argument("--keep-db", action="store_true")
    p.add_argument("--out", help="also write the JSON here")
    opts = p.parse_args(argv)
    global PLAN_CACHE_MODE
    PLAN_CACHE_MODE = opts.plan_cache_mode or None
    out = asyncio.run(_main(opts))
    text = json.dumps(out, indent=2, default=str)
    if opts.out:
        with open(opts.out, "w", encoding="utf-8") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
