"""While a snapshot is held, a holder's write to one row reads what that row needs, not history.

A long transaction - a report, a forgotten ``BEGIN`` - keeps every row version
the cycle replaces: neither page pruning nor vacuum may remove them, and an
index entry of such a version cannot be marked dead. A partial index on a
transient state (the running tasks, the unsettled operations, the pending
messages) then keeps an entry for every row that ever passed through the
state. The planner prices such an index by the few live rows it would hold
and picks it even for one row by its key; the scan then visits every entry
left behind - per row, per statement, growing for as long as the snapshot is
held. These tests run the holder's statements (the worker's and the relay's)
after a few and after many tasks went through the cycle under one held
snapshot, and count the index entries and rows each statement read
(``pg_stat_get_xact_tuples_returned`` over agentdb's tables and indexes, in
the statement's own transaction): a write by key reads the same either way.

Sequential scans are switched off on the measuring connections, as in
test_indexes.py: on tables this small the planner would rather scan a table
than use any index, which tables of production size do not see.

Not covered, because they do grow (the queue's head: docs/benchmarks.md,
section 5b): a claim walks the due index past the entries of the tasks taken
since the snapshot - once, which
test_G18_a_claim_reads_the_queue_s_head_once_while_a_snapshot_is_held holds -
and a relay's claim the pending index past the messages delivered since.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from agentdb import leases, operations, outbox, tasks, tenancy
from agentdb.models import Message, Reservation, Task
from agentdb.tools.bench.cycle import batched_steps
from agentdb.tools.bench.harness import HOUR, Cycle, seed_tasks
from tests.conftest import Database

pytestmark = pytest.mark.plain_postgres(
    "the counters read are the coordinator's; on Citus each statement reads on a worker"
)

# What agentdb's statements read in the current transaction, so far: index
# entries returned by index scans and rows by sequential scans, whether or not
# the version turned out visible.
_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0)::int8
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname LIKE 'agent\\_%' AND c.relkind IN ('r', 'i')
"""
_WARM = 1_000  # tasks through the cycle before the snapshot (the statistics' live table)
_FEW = 100  # under the snapshot, before the first measure
_MANY = 1_500  # more under the snapshot, before the second
# What one statement may read more after _MANY more tasks went through: nothing
# grows with them, so this is slack for a page split, not a per-task allowance.
_SLACK = 50


async def _cycle(conn: asyncpg.Connection, tenant: uuid.UUID, n: int) -> None:
    """``n`` tasks through the batched cycle, and their outbox messages delivered."""
    await seed_tasks(conn, tenant, "cycle", n)
    done = Cycle(0)
    while claimed := await leases.claim(
        conn, "cycler", batch=50, lease_ttl=HOUR, task_types=["cycle"]
    ):
        await batched_steps(conn, claimed, done)
    while sent := await outbox.claim(conn, "relay", batch=500):
        await outbox.mark_delivered(conn, sent)
    assert done.done == n
    assert done.refused == 0


# The statistics stay those of the ANALYZE below for the whole test. An
# autovacuum that ran mid-test would count the entries the snapshot keeps into
# a partial index's size, and the planner would leave that index for the
# primary key on its own: the positive control would then read nothing that
# grows (CI saw [101, 2]), and the measured statements would be spared the
# very plan the test is about.
_NO_AUTOVACUUM = """
DO $$
DECLARE t regclass;
BEGIN
  FOR t IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND c.relname LIKE 'agent\\_%' AND c.relkind = 'r'
  LOOP
    EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', t);
  END LOOP;
END $$
"""


Measure = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]


@contextlib.asynccontextmanager
async def _measuring(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A fresh connection (no plan cached from before), sequential scans off."""
    conn = await db.connect()
    try:
        await conn.execute("SET enable_seqscan = off")
        yield conn
    finally:
        await conn.close()


async def _reads(db: Database, tenant: uuid.UUID) -> dict[str, int]:
    """Per statement of a holder's path, what it read."""
    read: dict[str, int] = {}
    async with _measuring(db) as conn:

        async def measure(name: str, call: Callable[[], Awaitable[Any]]) -> Any:
            async with conn.transaction():
                before = await conn.fetchval(_READ)
                result = await call()
                read[name] = await conn.fetchval(_READ) - before
            return result

        await _holder_path(conn, tenant, measure)
    return read


async def _holder_path(conn: asyncpg.Connection, tenant: uuid.UUID, measure: Measure) -> None:
    await seed_tasks(conn, tenant, "measured", 10)
    # The claim is measured by nobody here: it walks the queue's head (module doc).
    claimed: list[Task] = await leases.claim(
        conn, "measurer", batch=10, lease_ttl=HOUR, task_types=["measured"]
    )
    assert len(claimed) == 10
    batch, last = claimed[:8], claimed[8]
    lone = claimed[9]
    assert last.lease is not None
    assert lone.lease is not None
    reserved = await measure(
        "operations.reserve_many",
        lambda: operations.reserve_many(
            conn,
            [
                operations.ReserveRequest(t.lease, f"{t.id}/send", "send", {"n": 1})  # type: ignore[arg-type]
                for t in batch
            ],
        ),
    )
    one = await measure(
        "operations.reserve",
        lambda: operations.reserve(
            conn, last.tenant_id, last.id, f"{last.id}/send", "send", {"n": 1}, lease=last.lease
        ),
    )
    await measure(
        "operations.complete_many",
        lambda: operations.complete_many(
            conn,
            [
                operations.Completion(r.operation, result={}, provider_reference="p", lease=t.lease)
                for t, r in zip(batch, reserved, strict=True)
                if isinstance(r, Reservation)
            ],
        ),
    )
    started = await measure(
        "operations.start", lambda: operations.start(conn, one.operation, lease=last.lease)
    )
    await measure(
        "operations.complete",
        lambda: operations.complete(
            conn, started, result={}, provider_reference="p", lease=last.lease
        ),
    )
    await measure("leases.renew", lambda: leases.renew(conn, last.lease))  # type: ignore[arg-type]
    await measure(
        "tasks.finish_many",
        lambda: tasks.finish_many(conn, batch, outbox={t.id: [Message("done", {})] for t in batch}),
    )
    await measure(
        "tasks.transition",
        lambda: tasks.transition(
            conn,
            last.tenant_id,
            last.id,
            expected_version=last.state_version,
            to_state="succeeded",
            lease=last.lease,
            outbox=[Message("done", {})],
        ),
    )
    await measure("leases.release", lambda: leases.release(conn, lone.lease))  # type: ignore[arg-type]
    sent = await outbox.claim(conn, "measurer", batch=9)
    assert len(sent) == 9
    await measure("outbox.mark_delivered", lambda: outbox.mark_delivered(conn, sent[:8]))
    await measure(
        "outbox.mark_failed",
        lambda: outbox.mark_failed(conn, sent[8], "said no", backoff=timedelta(seconds=1)),
    )


@contextlib.asynccontextmanager
async def _snapshot_held(db: Database) -> AsyncIterator[tuple[asyncpg.Connection, uuid.UUID]]:
    """A tenant whose table statistics saw _WARM tasks go through, then a snapshot held
    (REPEATABLE READ, on another connection) for the block."""
    conn = await db.connect()
    holder = await db.connect()
    try:
        tenant = await tenancy.create_tenant(conn, "held snapshot")
        await _cycle(conn, tenant, _WARM)
        await conn.execute(_NO_AUTOVACUUM)
        await conn.execute("ANALYZE")
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM agent_tasks")  # the snapshot is taken
        yield conn, tenant
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()
        await conn.close()


async def test_a_holders_writes_by_key_read_no_more_while_a_snapshot_is_held(db: Database) -> None:
    async with _snapshot_held(db) as (conn, tenant):
        await _cycle(conn, tenant, _FEW)
        few = await _reads(db, tenant)
        await _cycle(conn, tenant, _MANY)
        many = await _reads(db, tenant)
    grew = {name: (few[name], many[name]) for name in few if many[name] > few[name] + _SLACK}
    assert not grew, f"read (after {_FEW}, after {_FEW + _MANY} tasks under the snapshot): {grew}"
    assert set(few) == {
        "operations.reserve_many",
        "operations.reserve",
        "operations.complete_many",
        "operations.start",
        "operations.complete",
        "leases.renew",
        "tasks.finish_many",
        "tasks.transition",
        "leases.release",
        "outbox.mark_delivered",
        "outbox.mark_failed",
    }


async def test_the_count_sees_a_lookup_that_names_the_state(db: Database) -> None:
    """Positive control: a lookup of the tenant's running task that names the state, as the
    fences used to, reads every entry the held snapshot keeps (so the measure above can see
    growth). It does not name the key: with it, the planner takes the state's partial index
    only while its statistics count the few live rows, and autovacuum under load can recount
    them mid-test; without it, each index the planner may take (the partial index or the
    primary key, over the tenant's range) holds an entry for every task cycled."""
    lookup = (
        "SELECT count(*) FROM agent_tasks t WHERE t.tenant_id = $1"
        " AND t.state = 'running' AND t.lease_owner = 'prober'"
    )
    reads = []
    async with _snapshot_held(db) as (conn, tenant):
        await seed_tasks(conn, tenant, "probe", 1)
        assert len(await leases.claim(conn, "prober", lease_ttl=HOUR, task_types=["probe"])) == 1
        for n in (_FEW, _MANY):
            await _cycle(conn, tenant, n)
            async with _measuring(db) as fresh, fresh.transaction():
                before = await fresh.fetchval(_READ)
                assert await fresh.fetchval(lookup, tenant) == 1
                reads.append(await fresh.fetchval(_READ) - before)
    assert reads[1] > reads[0] + _MANY // 2, reads


async def test_G18_a_claim_reads_the_queue_s_head_once_while_a_snapshot_is_held(
    db: Database,
) -> None:
    """A claim still reads the due index past the entries of the tasks claimed since the
    snapshot (the module doc): its walk must find each tenant's first due task. It reads
    them once. The batch's own read starts where the walk found that first task, and a
    walk that wrapped around looks only at the tenants up to the one it started after -
    so after _MANY more tasks went through, a claim reads about _MANY more entries,
    whether it names the tenant it starts after (as the worker does) or not. Read twice
    or three times over, that was what cost a held snapshot's claims (docs/benchmarks.md,
    section 5b). Kills generated ``gen-leases-lease_claim-and-*`` mutants that drop either
    bound (the pair's range from ``first_wake``; the wrap-around ``<= $5``): each reads the
    head again."""
    grown: dict[str, list[int]] = {"after none": [], "after the tenant": []}
    async with _snapshot_held(db) as (conn, tenant):
        for n in (_FEW, _MANY):
            await _cycle(conn, tenant, n)
            await seed_tasks(conn, tenant, "cycle", 10)  # due, behind what was claimed
            for label, after in (("after none", None), ("after the tenant", tenant)):
                async with _measuring(db) as fresh:
                    tx = fresh.transaction()
                    await tx.start()
                    before = await fresh.fetchval(_READ)
                    got = await leases.claim(
                        fresh, "m", batch=5, lease_ttl=HOUR, task_types=["cycle"],
                        after_tenant=after,
                    )  # fmt: skip
                    grown[label].append(await fresh.fetchval(_READ) - before)
                    assert len(got) == 5
                    await tx.rollback()  # the claim leaves the queue as it found it
            # The 10 seeded go through too, so the next _cycle counts only its own.
            while claimed := await leases.claim(
                conn, "cycler", batch=50, lease_ttl=HOUR, task_types=["cycle"]
            ):
                await batched_steps(conn, claimed, Cycle(0))
    for label, (few, many) in grown.items():
        # Positive control: the walk does read the entries the snapshot keeps.
        assert many - few > _MANY // 2, (label, few, many)
        assert many - few < 3 * _MANY // 2, (label, few, many)
