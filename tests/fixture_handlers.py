"""Handlers and publishers the CLI tests load by MODULE:ATTRIBUTE."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from agentdb.models import Message, OutboxMessage
from agentdb.worker import Job, Succeed


async def slow(job: Job) -> None:
    """Sleeps far longer than any test waits; records that it started."""
    await asyncio.to_thread(Path(os.environ["AGENTDB_TEST_MARKER"]).write_text, str(job.task.id))
    await asyncio.sleep(3600)


async def finishing(job: Job) -> Succeed:
    """Done at once, with an outbox message: its finishing write is the one a test can hold up
    (by locking ``agent_outbox``) without blocking claims, renewals or releases."""
    return Succeed(outbox=(Message("fixture.finished", {"task": str(job.task.id)}),))


def not_async(job: Job) -> None:
    """A plain def: refused when the worker starts."""


async def brief(job: Job) -> None:
    """Runs for 20 ms: long enough that a capped tenant's slots are all taken at once."""
    await asyncio.sleep(0.02)


HANDLERS = {"slow": slow}
#: Short jobs of two types, for the concurrency-cap tests (G18).
BRIEF = {"capped": brief, "free": brief}
#: Jobs that stay in flight: one in its handler, one in its finishing write (when held up).
IN_FLIGHT = {"slow": slow, "finishing": finishing}
NOT_ASYNC = {"slow": slow, "sync.job": not_async}
NOT_A_DICT = 42


async def broken_publisher(message: OutboxMessage) -> None:
    raise ConnectionError("broker refused the connection")


async def quiet_publisher(message: OutboxMessage) -> None:
    """Accepts every message (a consumer that is always up)."""


async def rated(job: Job) -> None:
    """One call of the rate-limited action 'rated.call' (G19), then done."""
    res = await job.reserve(f"rated-{job.task.id}", "rated.call", {"i": job.task.params["i"]})
    if res.fresh:
        await job.complete(res.operation, result={"ok": True})


#: A task whose one call is rate-limited (tests/test_budgets.py).
RATED = {"rated": rated}


async def stubborn(job: Job) -> None:
    """Swallows every cancellation: a handler that will not stop (records that it started)."""
    await asyncio.to_thread(Path(os.environ["AGENTDB_TEST_MARKER"]).write_text, str(job.task.id))
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


#: A job whose handler ignores its cancellation.
STUBBORN = {"stubborn": stubborn}


async def plan_mode(job: Job) -> None:
    """Records how its worker's pooled sessions plan prepared statements."""
    mode = await job.pool.fetchval("SELECT current_setting('plan_cache_mode')")
    await asyncio.to_thread(Path(os.environ["AGENTDB_TEST_MARKER"]).write_text, str(mode))


#: A job that reads its pool's plan cache mode (tests/test_worker.py).
PLAN_MODE = {"plan_mode": plan_mode}


async def poison_publisher(message: OutboxMessage) -> None:
    """Kills its own relay process (SIGKILL) on a 'poison' message, as a message that
    crashes the publisher's library would; publishes every other message."""
    if message.topic == "poison":
        os.kill(os.getpid(), signal.SIGKILL)
