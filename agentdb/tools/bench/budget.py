"""The cost of the budget guarantee (G19): reserve with a budget against reserve without.

Both variants are the same helper (:func:`agentdb.operations.reserve`) under a
lease, on the same connections, interleaved in every repetition; the only
difference is ``cost=``, which holds the estimate on a budget in the same
statement. Each connection works for a tenant of its own with a budget of
its own, so what is measured is the statement, not a queue on one budget
row (a tenant's workers sharing one budget do wait on each other for its
row lock: that wait is the guarantee itself).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from statistics import median
from typing import Any

from agentdb import _db, budgets, leases, operations, tenancy
from agentdb.tools.bench.harness import ANALYZE, HOUR, Database, Probe, Sizes, hold, seed_tasks
from agentdb.tools.bench.statements import Slot

__all__ = ["bench_budget"]

_WARM = 4
_COST = {"tokens": 10}


async def _reserve(conn: _db.Conn, s: Slot, n: int, tag: str, *, costed: bool) -> None:
    for i in range(n):
        await operations.reserve(
            conn, s.tenant, s.task_id, f"{tag}-{i}", "send", {"n": i}, lease=s.lease,
            cost=_COST if costed else None,
        )  # fmt: skip


async def _each(held: list[_db.Conn], slots: list[Slot], n: int, tag: str, costed: bool) -> None:
    await asyncio.gather(
        *(_reserve(c, s, n, f"{tag}-{k}", costed=costed)
          for k, (c, s) in enumerate(zip(held, slots, strict=True)))
    )  # fmt: skip


async def bench_budget(db: Database, sizes: Sizes, reps: int, probe: Probe) -> dict[str, Any]:
    """Reserves per second with and without a budget, and their ratio (median of the reps).

    Raises:
        DatabaseUnavailable: the pool could not be opened.
    """
    conns = sizes.stmt_conns
    per_conn = max(1, sizes.stmt_ops // conns)
    total = per_conn * conns
    pool = await _db.create_pool(db.url, min_size=conns, max_size=conns)
    try:
        slots: list[Slot] = []
        for i in range(conns):
            # A tenant per connection, as tenants' workers run side by side.
            tenant = await tenancy.create_tenant(pool, f"bench-budget-{i}-{uuid.uuid4().hex[:8]}")
            await seed_tasks(pool, tenant, "budget-slot", 1)
            [task] = await leases.claim(pool, f"budget-{i}", lease_ttl=HOUR,
                                        task_types=["budget-slot"])  # fmt: skip
            assert task.lease is not None
            slots.append(Slot(tenant, task.lease, task.state_version))
            await budgets.set_budget(pool, tenant, "tokens", 2**60)
        rates: dict[str, list[float]] = {"with": [], "without": []}
        async with hold(pool, conns) as held:
            for variant in ("with", "without"):
                await _each(held, slots, _WARM, f"warm-{variant}", variant == "with")
            for rep in range(reps):
                # Alternate which goes first: a rep's second run meets bigger tables
                # and a warmer cache than its first.
                for variant in ("with", "without") if rep % 2 == 0 else ("without", "with"):
                    await held[0].execute(ANALYZE)
                    work = functools.partial(
                        _each, held, slots, per_conn, f"{variant}-{rep}", variant == "with"
                    )
                    _, window = await probe.timed(db.name, work)
                    rates[variant].append(total / window.seconds)
        ratio = median(w / o for w, o in zip(rates["with"], rates["without"], strict=True))
        return {"ops_per_rep": total, "connections": conns, **rates, "ratio": ratio}
    finally:
        await pool.close()
