"""Handlers that misbehave: the task never stays 'running' behind its worker.

Each case ends with the task out of 'running', ``last_error`` saying why, its
event written, and the same worker serving the next task. The
``asyncio_errors`` guard (from test_worker) fails any test whose event loop
reports an exception nobody retrieved. Finishing writes that do not land, and
shutdown, are in test_worker_finishing.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import re
import uuid
from datetime import timedelta
from typing import Any, cast
from unittest.mock import AsyncMock

import asyncpg
import pytest

from agentdb import tasks
from agentdb.errors import ConfigurationError
from agentdb.models import Message, Task
from agentdb.worker import Fail, Job, Succeed, Wait, Worker
from tests.conftest import Database, Tenants
from tests.test_worker import (
    _spawn,
    _state_is,
    _until,
    asyncio_errors,  # noqa: F401 - autouse: guards these tests too
    running,
)

LONG = timedelta(minutes=30)  # a lease that never expires during a test


async def _ok(job: Job) -> None:
    return None


def _worker(pool: asyncpg.Pool, handler: Any, **kw: Any) -> Worker:
    return Worker(pool, {"bad": handler, "ok": _ok}, poll_interval=0.05, **kw)


async def _serves_another(pool: asyncpg.Pool, tenant: uuid.UUID) -> None:
    after = await tasks.create(pool, tenant, "ok")
    await _until(lambda: _state_is(pool, tenant, after.id, "succeeded"))


async def _events(conn: asyncpg.Connection, task_id: uuid.UUID) -> list[str]:
    rows = await conn.fetch(
        "SELECT event_type FROM agent_events WHERE task_id = $1 ORDER BY task_state_version, id",
        task_id,
    )
    return [r["event_type"] for r in rows]


async def _last_event_is(conn: asyncpg.Connection, task_id: uuid.UUID, event: str) -> bool:
    events = await _events(conn, task_id)
    return bool(events) and events[-1] == event


async def _outbox_rows(conn: asyncpg.Connection, task_id: uuid.UUID) -> int:
    n: int = await conn.fetchval("SELECT count(*) FROM agent_outbox WHERE task_id = $1", task_id)
    return n


# ---- the guard ---------------------------------------------------------------------


async def test_the_guard_sees_a_task_exception_nobody_retrieved(
    asyncio_errors: list[logging.LogRecord],  # noqa: F811 - the fixture itself
) -> None:
    async def boom() -> None:
        raise RuntimeError("nobody looks at me")

    orphan = asyncio.create_task(boom())
    await asyncio.wait([orphan])
    del orphan
    gc.collect()
    assert any("never retrieved" in r.getMessage() for r in asyncio_errors)
    asyncio_errors.clear()  # seen: this test passes


# ---- what a handler returns --------------------------------------------------------


async def _fails_once(
    pool: asyncpg.Pool, tenant: uuid.UUID, admin: asyncpg.Connection, handler: Any
) -> tuple[Task, Worker]:
    """Run ``handler`` on one task: it must end 'failed' after one attempt, with its event
    and ``last_error``, and the worker must serve the next task."""
    task = await tasks.create(pool, tenant, "bad", max_attempts=5)
    worker = _worker(pool, handler)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenant, task.id, "failed"))
        await _serves_another(pool, tenant)
    done = await tasks.get(pool, tenant, task.id)
    assert done.attempts == 1  # not retried: another attempt would end the same way
    assert done.last_error is not None
    assert (await _events(admin, task.id))[-1] == "task.failed"
    return done, worker


def _returning(value: object) -> Any:
    async def handler(job: Job) -> object:
        return value

    return handler


@pytest.mark.parametrize("value", [42, "done", {"status": "done"}], ids=["int", "str", "dict"])
async def test_a_handler_returning_a_non_outcome_fails_the_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, value: object
) -> None:
    done, worker = await _fails_once(pool, tenants.a, admin_conn, _returning(value))
    assert done.last_error == (
        f"handler returned {type(value).__name__}, not None or an outcome "
        "(Succeed, Retry, Wait, Fail)"
    )
    assert (worker.stats.failed, worker.stats.succeeded) == (1, 1)


def _sync(job: Job) -> None:
    return None


async def _async(job: Job, extra: int = 0) -> None:
    return None


class _SyncCall:
    def __call__(self, job: Job) -> None:
        return None


class _AsyncCall:
    async def __call__(self, job: Job) -> None:
        return None

    async def method(self, job: Job) -> None:
        return None


@functools.wraps(_async)
def _wrapping(job: Job) -> Any:
    return _async(job)


REFUSED: list[tuple[str, object]] = [
    ("def", _sync),
    ("lambda", lambda job: None),
    ("sync __call__", _SyncCall()),
    ("partial of a def", functools.partial(_sync)),
    ("the class of an async __call__", _AsyncCall),
    ("not callable", 42),
]
ACCEPTED: list[tuple[str, object]] = [
    ("async def", _async),
    ("partial", functools.partial(_async, extra=1)),
    ("async __call__", _AsyncCall()),
    ("partial of an async __call__", functools.partial(_AsyncCall())),
    ("bound async method", _AsyncCall().method),
    ("AsyncMock", AsyncMock()),
    ("functools.wraps of an async def", _wrapping),
]


@pytest.mark.parametrize(("kind", "handler"), REFUSED, ids=[k for k, _ in REFUSED])
async def test_a_handler_that_is_not_async_is_refused_when_the_worker_starts(
    kind: str, handler: object
) -> None:
    with pytest.raises(ConfigurationError, match=r"handler for task type 'bad' is not an async"):
        Worker(cast(Any, None), {"ok": _ok, "bad": cast(Any, handler)})


@pytest.mark.parametrize(("kind", "handler"), ACCEPTED, ids=[k for k, _ in ACCEPTED])
async def test_async_callables_of_every_shape_are_accepted(kind: str, handler: object) -> None:
    Worker(cast(Any, None), {"t": cast(Any, handler)})


async def test_a_reconcile_hook_that_is_not_async_is_refused_when_the_worker_starts() -> None:
    with pytest.raises(ConfigurationError, match=r"reconcile hook for action 'charge'"):
        Worker(cast(Any, None), {"t": _ok}, reconcilers={"charge": cast(Any, _sync)})


async def test_a_handler_that_passes_the_check_but_returns_no_awaitable_fails_the_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A decorator that claims (``__wrapped__``) to be the async def it wraps, but is not."""

    @functools.wraps(_async)
    def liar(job: Job) -> None:
        return None

    done, _ = await _fails_once(pool, tenants.a, admin_conn, liar)
    assert done.last_error is not None
    assert done.last_error.startswith("handler is not async: its call returned NoneType")


def test_the_cli_refuses_a_module_with_a_sync_handler_in_one_line(db: Database) -> None:
    proc = _spawn(db, "worker", "tests.fixture_handlers:NOT_ASYNC")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith("agentdb: tests.fixture_handlers:NOT_ASYNC: handler for task type")
    assert "'sync.job' is not an async callable (got function not_async)" in err


# ---- how a handler stops -----------------------------------------------------------


async def test_a_handler_exception_is_logged_once_with_its_traceback_and_retried(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its message carries a NUL byte, which a Postgres text column cannot hold."""

    async def bad(job: Job) -> None:
        raise ValueError("model said \x00 and stopped")

    task = await tasks.create(pool, tenants.a, "bad")
    worker = _worker(pool, bad, retry_base=60)
    with caplog.at_level(logging.WARNING, logger="agentdb.worker"):
        async with running(worker):
            await _until(lambda: _last_event_is(admin_conn, task.id, "task.retry"))
            await _serves_another(pool, tenants.a)
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.last_error == "ValueError: model said \\x00 and stopped"
    assert (await _events(admin_conn, task.id))[-1] == "task.retry"
    logged = [r for r in caplog.records if r.exc_info and str(task.id) in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[0] is ValueError


async def test_a_handler_cancelled_by_something_of_its_own_is_retried(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async def bad(job: Job) -> None:
        inner = asyncio.create_task(asyncio.sleep(3600))
        inner.cancel()
        await inner  # CancelledError, not from the worker

    task = await tasks.create(pool, tenants.a, "bad")
    worker = _worker(pool, bad, retry_base=60)
    async with running(worker):
        await _until(lambda: _last_event_is(admin_conn, task.id, "task.retry"))
        await _serves_another(pool, tenants.a)
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.last_error is not None
    assert done.last_error.startswith("CancelledError")
    assert (await _events(admin_conn, task.id))[-1] == "task.retry"


class _OwnBase(BaseException):
    """A BaseException of the handler's own: no Exception, no CancelledError."""


@pytest.mark.parametrize(
    "escape",
    [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), _OwnBase("its own")],
    ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit", "own-BaseException"],
)
async def test_a_handler_raising_a_base_exception_is_a_failed_attempt_not_the_worker_s_end(
    escape: BaseException, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """SystemExit and KeyboardInterrupt raised in the handler's task ended the event loop
    (every job left running, no shutdown); the others ended the job runner with the task
    still 'running' until its lease ran out."""

    async def bad(job: Job) -> None:
        raise escape

    task = await tasks.create(pool, tenants.a, "bad")
    worker = _worker(pool, bad, retry_base=60, lease_ttl=LONG)
    async with running(worker):
        await _until(lambda: _last_event_is(admin_conn, task.id, "task.retry"))
        await _serves_another(pool, tenants.a)
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.state == "pending"
    assert done.last_error is not None
    assert done.last_error.startswith(type(escape).__name__), done.last_error


async def test_a_handler_exception_whose_str_raises_is_recorded_by_its_type(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no text for you")

    async def bad(job: Job) -> None:
        raise Unprintable

    task = await tasks.create(pool, tenants.a, "bad")
    async with running(_worker(pool, bad, retry_base=60)):
        await _until(lambda: _last_event_is(admin_conn, task.id, "task.retry"))
        await _serves_another(pool, tenants.a)
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.last_error == "Unprintable: (its str() raised)"


@pytest.mark.parametrize(
    ("outcome", "state"),
    [(Succeed(), "succeeded"), (Fail("gave up"), "failed")],
    ids=["Succeed", "Fail"],
)
async def test_a_reservation_left_unsettled_by_a_finished_task_is_marked_unknown(
    outcome: Any,
    state: str,
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
) -> None:
    """A finished task is never claimed again: its unsettled operation stayed 'reserved'
    for good, and every other task reusing the key got OperationInFlight."""

    async def bad(job: Job) -> object:
        await job.reserve("left-open", "charge", {"n": 1})
        settled = await job.reserve("settled", "charge", {"n": 2})
        await job.complete(settled.operation, result={"ok": True})  # control
        return outcome

    task = await tasks.create(pool, tenants.a, "bad")
    async with running(_worker(pool, bad, retry_base=60)):
        await _until(lambda: _state_is(pool, tenants.a, task.id, state))
    rows = await admin_conn.fetch(
        "SELECT idempotency_key, state FROM agent_operations WHERE task_id = $1", task.id
    )
    assert {r["idempotency_key"]: r["state"] for r in rows} == {
        "left-open": "unknown",
        "settled": "succeeded",
    }


# ---- outcomes the caps or the database refuse -----------------------------------------

NAN = float("nan")
# Each refusal, and the start of the last_error it leaves (a regex: where the client-side
# checks end and the database's begin is the library's business, not the worker's).
REFUSALS: list[tuple[str, object, str]] = [
    (
        "outbox payload over 64 KiB",
        Succeed(outbox=(Message("big", {"blob": "x" * 70_000}),)),
        r"Succeed: PayloadTooLarge: outbox payload for big is \d+ bytes",
    ),
    (
        "event payload over 8 KiB",
        Succeed(payload={f"k{i}": "v" * 100 for i in range(100)}),
        r"Succeed: PayloadTooLarge: event payload is \d+ bytes",
    ),
    (
        "NaN in the event payload",
        Succeed(payload={"score": NAN}),
        r"Succeed: ConfigurationError: event payload is not JSON-serialisable",
    ),
    (
        "NaN in an outbox payload",
        Succeed(outbox=(Message("scores", {"score": NAN}),)),
        r"Succeed: ConfigurationError: outbox payload for scores is not JSON-serialisable",
    ),
    (
        "NUL byte in the event payload",
        Succeed(payload={"note": "before\x00after"}),
        r"Succeed: (ConfigurationError|UntranslatableCharacterError): .*(NUL|Unicode escape)",
    ),
    (
        "outbox topic the database CHECK refuses",
        Succeed(outbox=(Message("t" * 201, {}),)),
        r"Succeed: (InvariantViolation|CheckViolationError): .*agent_outbox_topic_valid",
    ),
    (
        "Wait until something that is not a time",
        Wait(until=cast(Any, "tomorrow")),
        r"Wait: (DataError|ConfigurationError): ",
    ),
    ("Fail with no error text", Fail(cast(Any, None)), r"Fail: AttributeError: "),
]


@pytest.mark.parametrize(("case", "outcome", "why"), REFUSALS, ids=[c for c, _, _ in REFUSALS])
async def test_an_outcome_that_is_refused_fails_the_task_saying_why(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    case: str,
    outcome: object,
    why: str,
) -> None:
    done, worker = await _fails_once(pool, tenants.a, admin_conn, _returning(outcome))
    assert done.last_error is not None
    assert re.match("outcome refused: " + why, done.last_error, re.S), done.last_error
    assert await _outbox_rows(admin_conn, done.id) == 0  # nothing of the refused outcome
    assert (worker.stats.refused, worker.stats.failed) == (1, 1)
