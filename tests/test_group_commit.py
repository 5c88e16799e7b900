"""The worker's group commit of successes: many jobs, one statement, every element fenced alone.

Handlers held at one event finish together, so their successes reach the
completer while its first flush is being set up and share it. Each element
keeps its own fence (G7, G12), cancel (G20) and payload; a batch refused as a
whole leaves each job to write its outcome alone, as before group commit.
The crash between flushes is in tests/test_crash.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

from agentdb import leases, operations, tasks
from agentdb.errors import ConfigurationError, TransientError
from agentdb.models import Message
from agentdb.worker import Fail, Job, Succeed, Worker
from agentdb.worker.outcomes import Handler
from tests import factories as F
from tests.conftest import Tenants
from tests.test_worker import _until, asyncio_errors, running  # noqa: F401 - autouse guard
from tests.test_worker_misbehaving import LONG, _events

KIND = "grouped"


def _together(*, nul_in: int | None = None) -> tuple[Handler, asyncio.Event, list[Job]]:
    """A handler whose jobs wait at one event; each succeeds with its own payload and
    message - task ``nul_in``'s payload with a NUL byte in it."""
    go = asyncio.Event()
    arrived: list[Job] = []

    async def handler(job: Job) -> Succeed:
        arrived.append(job)
        await go.wait()
        n = job.task.params["n"]
        payload = {"n": n, "note": "a\x00b"} if n == nul_in else {"n": n}
        return Succeed(payload=payload, outbox=(Message("grouped.done", {"n": n}),))

    return handler, go, arrived


async def _run_together(
    pool: asyncpg.Pool,
    tenant: uuid.UUID,
    n: int,
    *,
    nul_in: int | None = None,
    meanwhile: Callable[[list[uuid.UUID]], Awaitable[None]] | None = None,
    staged: tuple[Handler, asyncio.Event, list[Job]] | None = None,
    traced: bool = False,
) -> tuple[Worker, list[uuid.UUID]]:
    """``n`` tasks on one worker of concurrency ``n``, whose handlers (``staged``, default
    :func:`_together`'s) all go on at once (after ``meanwhile(ids)``, when given); back
    when every outcome is settled. ``traced``: each task has a trace id of its own."""
    handler, go, arrived = staged or _together(nul_in=nul_in)
    ids = await _seed(pool, tenant, n, traced=traced)
    worker = Worker(pool, {KIND: handler}, concurrency=n, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _arrived(arrived, n))
        if meanwhile is not None:
            await meanwhile(ids)
        go.set()
        await _until(lambda: _settled(worker, n))
    return worker, ids


async def _seed(
    pool: asyncpg.Pool, tenant: uuid.UUID, n: int, *, traced: bool = False
) -> list[uuid.UUID]:
    return [
        (
            await tasks.create(
                pool, tenant, KIND, params={"n": i}, lease_ttl=LONG,
                trace_id=f"{i + 1:032x}" if traced else None,
                span_id=f"{i + 1:016x}" if traced else None,
            )
        ).id
        for i in range(n)
    ]  # fmt: skip


async def _written(
    admin: asyncpg.Connection, task_id: uuid.UUID
) -> tuple[list[object], list[object]]:
    """The task's success events' payloads and its outbox messages' payloads."""
    events = await admin.fetch(
        "SELECT payload->>'n' AS n FROM agent_events WHERE task_id = $1"
        " AND event_type = 'task.succeeded'",
        task_id,
    )
    messages = await admin.fetch(
        "SELECT payload->>'n' AS n FROM agent_outbox WHERE task_id = $1", task_id
    )
    return [r["n"] for r in events], [r["n"] for r in messages]


async def test_G7_G12_successes_that_finish_together_share_one_statement_each_its_own(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    worker, ids = await _run_together(pool, tenants.a, 6)
    completer = worker._finisher.completer
    assert completer.grouped == 6, "the six successes were not written together"
    assert completer.group_commits < 6
    assert worker.stats.succeeded == 6
    for i, task_id in enumerate(ids):
        # Its own event payload and message (G8, G10), once - not a neighbour's.
        assert await _written(admin_conn, task_id) == ([f"{i}"], [f"{i}"])
        assert (await _events(admin_conn, task_id)).count("task.succeeded") == 1


async def _arrived(arrived: list[Job], n: int) -> bool:
    return len(arrived) == n


async def test_G12_G20_an_element_taken_over_or_cancelled_is_refused_alone_the_rest_commit(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Of four successes flushed together, one task was cancelled and one taken over by
    another worker while their handlers ran: those two are refused - nothing written
    for them - and the other two land, in the same statement."""

    async def meanwhile(ids: list[uuid.UUID]) -> None:
        await tasks.cancel(pool, tenants.a, ids[1], reason="test")
        await F.expire_lease(admin_conn, ids[2])
        [thief] = await leases.claim(pool, "thief", lease_ttl=LONG, task_types=[KIND])
        assert thief.id == ids[2]

    worker, ids = await _run_together(pool, tenants.a, 4, meanwhile=meanwhile)
    completer = worker._finisher.completer
    assert (completer.grouped, completer.group_commits) == (2, 1)
    assert (worker.stats.succeeded, worker.stats.cancelled) == (2, 1)
    assert worker.stats.late_writes_refused == 2
    states = [(await tasks.get(pool, tenants.a, t)).state for t in ids]
    assert states == ["succeeded", "cancelled", "running", "succeeded"]
    assert (await tasks.get(pool, tenants.a, ids[2])).lease_owner == "thief"
    for refused in (ids[1], ids[2]):
        assert await _written(admin_conn, refused) == ([], [])
    for landed, n in ((ids[0], "0"), (ids[3], "3")):
        assert await _written(admin_conn, landed) == ([n], [n])


async def test_a_group_commit_refused_as_a_whole_leaves_each_job_to_write_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """One success of three carries a NUL byte, which jsonb cannot hold: Postgres refuses
    the shared statement, and each job writes its outcome alone - the two good ones
    succeed, the bad one is failed with why (as it would have been without grouping)."""
    worker, ids = await _run_together(pool, tenants.a, 3, nul_in=1)
    completer = worker._finisher.completer
    assert (completer.group_commits, completer.grouped) == (0, 0)
    rows = [await tasks.get(pool, tenants.a, t) for t in ids]
    assert [r.state for r in rows] == ["succeeded", "failed", "succeeded"]
    assert (rows[1].last_error or "").startswith("outcome refused: Succeed: ")
    assert (worker.stats.succeeded, worker.stats.failed, worker.stats.refused) == (2, 1, 1)
    succeeded = [(await _events(admin_conn, t)).count("task.succeeded") for t in ids]
    assert succeeded == [1, 0, 1]


def _answer_lost(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """``module.name`` runs its statement, then raises as if the connection was lost
    before the answer came back (it committed). Returns a list that grows per call."""
    real = getattr(module, name)
    lost: list[int] = []

    async def answer_lost(*args: Any, **kw: Any) -> Any:
        await real(*args, **kw)
        lost.append(1)
        raise TransientError("connection lost after the commit: test")

    monkeypatch.setattr(module, name, answer_lost)
    return lost


async def test_a_group_commit_whose_answer_was_lost_is_found_landed_not_taken_over(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared statement commits and its answer is lost with the connection (the
    statement runs; the error is raised after it). Each job then writes alone, is
    refused by its fence - the batch moved the task on - and finds its success landed:
    counted as succeeded, nothing released, nothing written twice."""
    lost = _answer_lost(monkeypatch, tasks, "finish_many")
    worker, ids = await _run_together(pool, tenants.a, 3)
    assert lost, "no group commit ran"
    assert (worker.stats.succeeded, worker.stats.late_writes_refused) == (3, 0)
    assert worker.stats.released_unfinished == 0
    for i, task_id in enumerate(ids):
        assert await _written(admin_conn, task_id) == ([f"{i}"], [f"{i}"])
        assert "task.released" not in await _events(admin_conn, task_id)


async def _settled(worker: Worker, n: int) -> bool:
    s = worker.stats
    ended = s.succeeded + s.failed + s.late_writes_refused + s.lease_lost + s.released_unfinished
    return ended >= n


# ---- operations' completions -----------------------------------------------------------


def _completing() -> tuple[Handler, asyncio.Event, list[Job]]:
    """A handler that reserves its task's one operation, waits at one event with the
    others (its provider call done), then completes it and succeeds."""
    go = asyncio.Event()
    arrived: list[Job] = []

    async def handler(job: Job) -> None:
        n = job.task.params["n"]
        res = await job.reserve(f"op-{job.task.id}", "send", {"n": n})
        arrived.append(job)
        await go.wait()
        await job.complete(res.operation, result={"n": n}, provider_reference=f"ref-{n}")

    return handler, go, arrived


async def _complete_together(
    pool: asyncpg.Pool,
    tenant: uuid.UUID,
    n: int,
    meanwhile: Callable[[list[uuid.UUID]], Awaitable[None]] | None = None,
) -> tuple[Worker, list[uuid.UUID]]:
    return await _run_together(pool, tenant, n, meanwhile=meanwhile, staged=_completing())


async def _operation(admin: asyncpg.Connection, task_id: uuid.UUID) -> tuple[str, str | None, int]:
    """The task's operation: state, provider reference, and its 'succeeded' events."""
    row = await admin.fetchrow(
        "SELECT o.state, o.provider_reference, (SELECT count(*) FROM agent_events e"
        " WHERE e.operation_id = o.id AND e.event_type = 'operation.succeeded') AS n"
        " FROM agent_operations o WHERE o.task_id = $1",
        task_id,
    )
    assert row is not None
    return row["state"], row["provider_reference"], row["n"]


async def test_G13_completions_that_come_together_share_one_statement_each_its_own(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    worker, ids = await _complete_together(pool, tenants.a, 5)
    assert worker._completions.grouped == 5, "the five completions were not written together"
    assert worker.stats.succeeded == 5
    for i, task_id in enumerate(ids):
        assert await _operation(admin_conn, task_id) == ("succeeded", f"ref-{i}", 1)


async def test_G12_G20_a_completion_refused_in_a_group_commit_is_that_jobs_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Of four completions written together, one task was cancelled and one taken over
    meanwhile. The taken-over one is refused - its operation stays reserved, for the new
    holder to reconcile (G12, G13); the cancelled one's effect is still recorded (a cancel
    never makes an effect disappear, G20); the other two land and their tasks succeed."""

    async def meanwhile(ids: list[uuid.UUID]) -> None:
        await tasks.cancel(pool, tenants.a, ids[1], reason="test")
        await F.expire_lease(admin_conn, ids[2])
        [thief] = await leases.claim(pool, "thief", lease_ttl=LONG, task_types=[KIND])
        assert thief.id == ids[2]

    worker, ids = await _complete_together(pool, tenants.a, 4, meanwhile)
    completions = worker._completions
    assert (completions.group_commits, completions.grouped) == (1, 2)
    assert worker.stats.succeeded == 2
    assert await _operation(admin_conn, ids[0]) == ("succeeded", "ref-0", 1)
    assert await _operation(admin_conn, ids[1]) == ("succeeded", "ref-1", 1)
    assert await _operation(admin_conn, ids[2]) == ("reserved", None, 0)
    assert await _operation(admin_conn, ids[3]) == ("succeeded", "ref-3", 1)
    states = [(await tasks.get(pool, tenants.a, t)).state for t in ids]
    assert states == ["succeeded", "cancelled", "running", "succeeded"]


async def test_a_completion_group_commit_whose_answer_was_lost_is_found_landed(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The completions' statement commits and its answer is lost: each job writes alone,
    is refused (the operation moved on), finds its completion recorded and goes on."""
    lost = _answer_lost(monkeypatch, operations, "complete_many")
    worker, ids = await _complete_together(pool, tenants.a, 3)
    assert lost, "no group commit ran"
    assert worker.stats.succeeded == 3
    for i, task_id in enumerate(ids):
        assert await _operation(admin_conn, task_id) == ("succeeded", f"ref-{i}", 1)


# ---- reservations ----------------------------------------------------------------------


def _reserving(key: Callable[[Job], str] | None = None) -> tuple[Handler, asyncio.Event, list[Job]]:
    """A handler that waits at one event with the others, then reserves its operation
    (key ``key(job)``, default its own) and, if fresh, completes it and succeeds."""
    go = asyncio.Event()
    arrived: list[Job] = []

    async def handler(job: Job) -> Fail | None:
        n = job.task.params["n"]
        arrived.append(job)
        await go.wait()
        try:
            res = await job.reserve(key(job) if key else f"op-{job.task.id}", "send", {"n": 0})
        except ConfigurationError as exc:  # Postgres refused this key
            return Fail(str(exc))
        if res.fresh:
            await job.complete(res.operation, result={"n": n}, provider_reference=f"ref-{n}")
        return None

    return handler, go, arrived


async def _reserved(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """The task's operations: trace id, and the trace id and actor of their reserved event."""
    rows = await admin.fetch(
        "SELECT o.trace_id, e.trace_id AS event_trace, e.actor_id FROM agent_operations o"
        " JOIN agent_events e ON e.operation_id = o.id AND e.event_type = 'operation.reserved'"
        " WHERE o.task_id = $1",
        task_id,
    )
    return [tuple(r.values()) for r in rows]


async def test_G13_G16_reservations_that_come_together_share_one_statement_each_its_own(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Five jobs reserve at once: one statement reserves all five (each job goes on only
    once it has committed, G13), and each operation and its event carry their own task's
    trace id (G16) and its worker as the actor - not the first element's."""
    worker, ids = await _run_together(pool, tenants.a, 5, staged=_reserving(), traced=True)
    reservations = worker._reservations
    assert reservations.grouped == 5, "the five reservations were not written together"
    assert reservations.group_commits == 1
    assert worker.stats.succeeded == 5
    for i, task_id in enumerate(ids):
        trace = f"{i + 1:032x}"
        assert await _reserved(admin_conn, task_id) == [(trace, trace, worker.worker_id)]
        assert await _operation(admin_conn, task_id) == ("succeeded", f"ref-{i}", 1)


async def test_G16_grouped_reservations_take_each_jobs_own_span(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tasks with no trace ids of their own, each handler in a span of its own: each
    operation carries its handler's span, not that of the job whose write started the
    flush."""
    go = asyncio.Event()
    arrived: list[Job] = []

    async def handler(job: Job) -> None:
        n = job.task.params["n"]
        span = SpanContext(trace_id=n + 1, span_id=n + 1, is_remote=False)
        with trace.use_span(NonRecordingSpan(span)):
            arrived.append(job)
            await go.wait()
            await job.reserve(f"op-{job.task.id}", "send", {"n": n})

    worker, ids = await _run_together(pool, tenants.a, 4, staged=(handler, go, arrived))
    assert worker._reservations.grouped == 4
    for i, task_id in enumerate(ids):
        trace_id = f"{i + 1:032x}"
        assert await _reserved(admin_conn, task_id) == [(trace_id, trace_id, worker.worker_id)]


async def test_G13_a_reservation_whose_group_commit_answer_was_lost_is_the_jobs_own(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reservations' statement commits and its answer is lost: each job finds the
    operation it asked for by its id - its own, fresh reservation - and goes on to call
    and complete it; none is taken for a crashed attempt's and marked unknown."""
    lost = _answer_lost(monkeypatch, operations, "reserve_many")
    worker, ids = await _run_together(pool, tenants.a, 3, staged=_reserving())
    assert lost, "no group commit ran"
    assert worker.stats.succeeded == 3
    assert worker.stats.retried == 0
    for i, task_id in enumerate(ids):
        assert await _operation(admin_conn, task_id) == ("succeeded", f"ref-{i}", 1)
        # Taken for an earlier attempt's, it would be marked unknown and started again
        # (the ledger's record of a repeat): the same outcome, a false history.
        assert "operation.unknown" not in await _events(admin_conn, task_id)


async def test_G12_G20_a_reservation_refused_in_a_group_commit_is_that_jobs_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Of four reservations written together, one task was cancelled and one taken over
    meanwhile: nothing is reserved for either (G12, G20) - the cancelled job stops, the
    taken-over one loses its lease - and the other two reserve in one statement and
    succeed."""

    async def meanwhile(ids: list[uuid.UUID]) -> None:
        await tasks.cancel(pool, tenants.a, ids[1], reason="test")
        await F.expire_lease(admin_conn, ids[2])
        [thief] = await leases.claim(pool, "thief", lease_ttl=LONG, task_types=[KIND])
        assert thief.id == ids[2]

    worker, ids = await _run_together(pool, tenants.a, 4, meanwhile=meanwhile, staged=_reserving())
    reservations = worker._reservations
    assert (reservations.group_commits, reservations.grouped) == (1, 2)
    assert (worker.stats.succeeded, worker.stats.cancelled, worker.stats.lease_lost) == (2, 1, 2)
    for refused in (ids[1], ids[2]):
        assert await _reserved(admin_conn, refused) == []
    states = [(await tasks.get(pool, tenants.a, t)).state for t in ids]
    assert states == ["succeeded", "cancelled", "running", "succeeded"]


async def test_G3_two_jobs_reserving_one_key_together_reserve_it_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Three jobs reserve the same key at once (one batch cannot hold a key twice): the
    first of them reserves it in the group commit, the others reserve alone after it and
    are told it is in flight for another task (and retry) or replay its result - one
    operation, one effect (G3, G4)."""
    worker, _ = await _run_together(
        pool, tenants.a, 3, staged=_reserving(key=lambda job: "shared-key")
    )
    ops = await admin_conn.fetch(
        "SELECT task_id, state FROM agent_operations WHERE idempotency_key = 'shared-key'"
    )
    assert len(ops) == 1
    assert ops[0]["state"] == "succeeded"
    completed = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events e JOIN agent_operations o ON o.id = e.operation_id"
        " WHERE o.idempotency_key = 'shared-key' AND e.event_type = 'operation.succeeded'"
    )
    assert completed == 1
    # The others met the key in flight (and retried) or settled (and replayed its
    # result): all three succeed on the one effect.
    assert worker.stats.succeeded == 3
    # The first went in the flush, the others were held apart (reserved alone), not
    # refused with it: a grouped write landed.
    assert worker._reservations.grouped >= 1


async def test_a_reservation_group_commit_refused_as_a_whole_leaves_each_job_to_reserve_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """One of three keys carries a NUL byte, which text cannot hold: Postgres refuses the
    shared statement, and each job reserves alone - the two good ones reserve and
    succeed, the bad one's reserve raises, as it would have without grouping."""

    def key(job: Job) -> str:
        return f"op-\x00-{job.task.id}" if job.task.params["n"] == 1 else f"op-{job.task.id}"

    worker, ids = await _run_together(pool, tenants.a, 3, staged=_reserving(key=key))
    assert (worker._reservations.group_commits, worker._reservations.grouped) == (0, 0)
    assert [len(await _reserved(admin_conn, t)) for t in ids] == [1, 0, 1]
    states = [(await tasks.get(pool, tenants.a, t)).state for t in ids]
    assert states == ["succeeded", "failed", "succeeded"]
