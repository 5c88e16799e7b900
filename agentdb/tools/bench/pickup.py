"""Pickup latency: from a task's creation committing to its handler starting, on an idle worker.

A real :class:`agentdb.worker.Worker` (concurrency 1, in this process) waits
for work, woken by LISTEN/NOTIFY (``listen``) or by polling alone, as behind
a transaction pooler (``poll``). Tasks are created one at a time, each once
the previous one's handler started and after a random pause - up to one
poll interval, so the creations fall anywhere in the worker's nap. The
latency is from :func:`agentdb.tasks.create` being called to the handler's
first line. Not from it returning: the commit lands somewhere inside that
call, and the worker, sharing this event loop, can claim the task and start
its handler before the creating coroutine resumes - timed from the return,
such a pickup read as negative (CI saw it, polling). From the call it is an
upper bound that includes the create's own round trip (about a millisecond
here).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

from agentdb import _db, tasks, tenancy
from agentdb.tools.bench.harness import Database, median, percentile
from agentdb.worker import Job, Worker

__all__ = ["POLL_INTERVAL", "bench_pickup"]

#: The polling worker's ``poll_interval`` (seconds): its target is this + 10 ms.
POLL_INTERVAL = 0.2
_TYPE = "bench.pickup"
# Seconds one task may wait for its handler before the run gives up on it.
_PATIENCE = 10.0


async def _latencies(db: Database, n: int, *, listen: bool, rng: random.Random) -> list[float]:
    """Milliseconds from each creation to its handler, ``n`` of them."""
    pool = await _db.create_pool(db.url, min_size=2, max_size=3)
    started: dict[uuid.UUID, float] = {}
    arrived = asyncio.Event()

    async def handler(job: Job) -> None:
        started[job.task.id] = time.perf_counter()
        arrived.set()

    worker = Worker(
        pool, {_TYPE: handler}, worker_id=f"bench-pickup-{'listen' if listen else 'poll'}",
        concurrency=1, poll_interval=POLL_INTERVAL, listen_dsn=db.url if listen else None,
        maintenance_interval=3600.0,
    )  # fmt: skip
    running = asyncio.create_task(worker.run(install_signals=False))
    out: list[float] = []
    try:
        tenant = await tenancy.create_tenant(pool, f"bench-pickup-{uuid.uuid4().hex[:6]}")
        await asyncio.sleep(2 * POLL_INTERVAL)  # started, listening, idle
        for _ in range(n):
            await asyncio.sleep(rng.uniform(0.0, POLL_INTERVAL))
            arrived.clear()
            asked = time.perf_counter()
            task = await tasks.create(pool, tenant, _TYPE)
            while task.id not in started:
                await asyncio.wait_for(arrived.wait(), _PATIENCE)
                arrived.clear()
            out.append((started[task.id] - asked) * 1000)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await pool.close()
    return out


async def bench_pickup(db: Database, samples: int, seed: int = 0) -> dict[str, Any]:
    """Pickup latency with LISTEN and with polling alone, ``samples`` tasks each.

    Raises:
        TimeoutError: a handler did not start within 10 s of its task's creation.
        DatabaseUnavailable: the pool could not be opened.
    """
    rng = random.Random(seed)
    out: dict[str, Any] = {"samples": samples, "poll_interval_ms": POLL_INTERVAL * 1000}
    for mode in ("listen", "poll"):
        ms = await _latencies(db, samples, listen=mode == "listen", rng=rng)
        out[mode] = {
            "p50_ms": median(ms),
            "p95_ms": percentile(ms, 95),
            "max_ms": max(ms),
            "ms": ms,
        }
    return out
