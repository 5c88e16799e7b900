"""Outbox relay: :class:`agentdb.relay.Relay` and the outbox helpers against raw SKIP LOCKED drains.

Every drain empties the pending outbox of one database, batch by batch, into
a publisher that accepts everything at once, and returns how many rows it
delivered: the relay's own cost is what is measured.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString, TypeAlias

from agentdb import _db, outbox, tenancy
from agentdb.models import OutboxMessage
from agentdb.tools.bench.harness import ANALYZE, Database, Probe, Sizes

__all__ = ["RELAYS", "Drain", "bench_relay", "deliver_pending", "seed_outbox"]

_SEED_OUTBOX: LiteralString = """
INSERT INTO agent_outbox (tenant_id, topic, payload)
SELECT $1, 'bench.relay', jsonb_build_object('n', g) FROM generate_series(1, $2) AS g
"""
# The raw baselines: what one would hand-write without agentdb.
# One statement per batch: mark delivered, then publish (at most once).
_RAW_DRAIN: LiteralString = """
WITH due AS (
    SELECT tenant_id, id FROM agent_outbox
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_outbox o SET state = 'delivered', delivered_at = now()
FROM due WHERE o.tenant_id = due.tenant_id AND o.id = due.id
RETURNING o.id, o.topic, o.payload
"""
# Select under a row lock, publish, mark, commit (at least once; holds a
# transaction across the publish).
_RAW_SELECT: LiteralString = """
SELECT tenant_id, id, topic, payload FROM agent_outbox
WHERE state = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
_RAW_MARK: LiteralString = """
UPDATE agent_outbox SET state = 'delivered', delivered_at = now()
WHERE (tenant_id, id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
"""

#: Rows per claim, for every drain.
_RELAY_BATCH = 100

#: ``drain(pool, batch)``: deliver every pending row; return how many were delivered.
Drain: TypeAlias = Callable[[_db.Pool, int], Awaitable[int]]


async def seed_outbox(pool: _db.Pool, tenant: uuid.UUID, n: int) -> None:
    """Enqueue ``n`` pending outbox rows for ``tenant``."""
    await pool.execute(_SEED_OUTBOX, tenant, n)


async def deliver_pending(pool: _db.Pool) -> None:
    """Mark every pending row delivered, untimed (the task cycle leaves its rows behind)."""
    while await pool.fetch(_RAW_DRAIN, 1000):
        pass


async def _publish(message: OutboxMessage | _db.Record) -> None:
    """A publisher that accepts everything at once: the relay's own cost is what is measured."""


async def _relay_agentdb(pool: _db.Pool, batch: int) -> int:
    from agentdb.relay import Relay

    relay = Relay(pool, _publish, relay_id="bench-relay", batch=batch)
    return await relay.drain()


async def _relay_helpers(pool: _db.Pool, batch: int) -> int:
    delivered = 0
    while claimed := await outbox.claim(pool, "bench-helpers", batch=batch):
        for m in claimed:
            await _publish(m)
        delivered += len(await outbox.mark_delivered(pool, claimed))
    return delivered


async def _relay_raw_one_statement(pool: _db.Pool, batch: int) -> int:
    delivered = 0
    while rows := await pool.fetch(_RAW_DRAIN, batch):
        for r in rows:
            await _publish(r)
        delivered += len(rows)
    return delivered


async def _relay_raw_transaction(pool: _db.Pool, batch: int) -> int:
    delivered = 0
    async with _db.connection(pool) as conn:
        while True:
            async with conn.transaction():
                rows = await conn.fetch(_RAW_SELECT, batch)
                for r in rows:
                    await _publish(r)
                await conn.execute(
                    _RAW_MARK, [r["tenant_id"] for r in rows], [r["id"] for r in rows]
                )
            if not rows:
                return delivered
            delivered += len(rows)


#: (name, how, drain), in the order they run.
RELAYS: tuple[tuple[str, str, Drain], ...] = (
    (
        "agentdb Relay.drain()",
        "claim, publish in lanes, mark + claim the next in one statement",
        _relay_agentdb,
    ),
    ("agentdb outbox.claim + mark_delivered", "the helpers in a plain loop", _relay_helpers),
    (
        "raw SKIP LOCKED, one statement",
        "UPDATE … RETURNING, then publish (at most once)",
        _relay_raw_one_statement,
    ),
    (
        "raw SKIP LOCKED, transaction",
        "BEGIN, SELECT … FOR UPDATE, publish, UPDATE, COMMIT",
        _relay_raw_transaction,
    ),
)


async def bench_relay(db: Database, sizes: Sizes, reps: int, probe: Probe) -> list[dict[str, Any]]:
    """Every drain of :data:`~agentdb.tools.bench.relay.RELAYS` over the same seeded outbox.

    Raises:
        DatabaseUnavailable: the pool could not be opened; whatever a drain raises.
    """
    pool = await _db.create_pool(db.url, min_size=2, max_size=2)
    try:
        tenant = await tenancy.create_tenant(pool, f"bench-relay-{uuid.uuid4().hex[:8]}")
        await deliver_pending(pool)
        out: dict[str, dict[str, Any]] = {
            name: {
                "name": name,
                "how": how,
                "batch": _RELAY_BATCH,
                "rows_per_run": sizes.relay_rows,
                "rows_per_s": [],
                "client_cpu_share": [],
                "errors": [],
            }
            for name, how, _ in RELAYS
        }
        for rep in range(reps):
            for name, _, drain in RELAYS:
                await seed_outbox(pool, tenant, sizes.relay_rows)
                await pool.execute(ANALYZE)
                work = functools.partial(drain, pool, _RELAY_BATCH)
                delivered, window = await probe.timed(db.name, work)
                if delivered != sizes.relay_rows:
                    out[name]["errors"].append(
                        f"rep {rep}: delivered {delivered} of {sizes.relay_rows}"
                    )
                out[name]["rows_per_s"].append(delivered / window.seconds)
                out[name]["client_cpu_share"].append(
                    probe.usage(window, delivered)["client_cpu_share"]
                )
        return list(out.values())
    finally:
        await pool.close()
