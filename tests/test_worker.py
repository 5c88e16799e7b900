"""The worker (G12, G13): takeover, heartbeat, shutdown, retries, unsettled operations."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from agentdb import _db, leases, operations, tasks
from agentdb.errors import OperationInFlight, TransientError
from agentdb.models import Lease, Operation
from agentdb.testing._postgres import ON_CITUS
from agentdb.worker import MANUAL, Fail, Job, Reconciled, Retry, Worker
from tests import factories as F
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def asyncio_errors() -> Iterator[list[logging.LogRecord]]:
    """Fail the test on what asyncio reports only in its log: "Task exception was never
    retrieved", an exception in a callback, a task destroyed while pending.

    (Warnings such as "coroutine was never awaited" and unraisable exceptions
    pytest reports itself, as errors.) Torn down after the test's event loop
    closed, so that loop's last reports are seen too.
    """
    gc.collect()  # what earlier tests left behind reports now, not against this test
    caught = _Collect()
    logger = logging.getLogger("asyncio")
    logger.addHandler(caught)
    try:
        yield caught.records
        gc.collect()  # a task in a reference cycle reports only when collected
    finally:
        logger.removeHandler(caught)
    assert not caught.records, [
        r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "") for r in caught.records
    ]


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[object]]:
    runner: asyncio.Task[object] = asyncio.create_task(worker.run(install_signals=False))
    try:
        yield runner
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)


async def _until(predicate: object, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def test_G12_a_stale_workers_late_complete_is_refused_and_counted(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        await release.wait()  # a long model call; meanwhile the lease is taken over

    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(minutes=10))
    # One slot, held by the stalled attempt: the stale worker itself cannot re-claim
    # the task once its lease expires, only the rescuer below can.
    stale = Worker(pool, {"t": handler}, worker_id="stale", poll_interval=0.05, concurrency=1)
    async with running(stale):
        await asyncio.wait_for(started.wait(), 10)
        await F.expire_lease(admin_conn, task.id)  # as if the worker had stalled past its TTL
        [taken] = await leases.claim(pool, "rescuer")
        assert taken.lease_token == 2
        release.set()  # the stale attempt finishes and tries to complete
        await _until(lambda: _settled(stale))
    assert stale.stats.late_writes_refused == 1
    assert stale.stats.succeeded == 0
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.lease_owner, now.lease_token) == ("running", "rescuer", 2)


async def _settled(worker: Worker) -> bool:
    return worker.stats.late_writes_refused + worker.stats.succeeded > 0


async def test_G12_heartbeat_keeps_a_task_longer_than_its_ttl(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    async def handler(job: Job) -> None:
        await asyncio.sleep(5)  # 2.5 TTLs

    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(seconds=2))
    worker = Worker(pool, {"t": handler}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "running"))
        # A rival keeps trying to take the task over until it is done.
        while (await tasks.get(pool, tenants.a, task.id)).state == "running":
            assert await leases.claim(pool, "rival") == []
            await asyncio.sleep(0.05)
    done = await tasks.get(pool, tenants.a, task.id)
    assert (done.lease_token, done.attempts) == (1, 1)  # never taken over
    assert worker.stats.lease_lost == 0


async def _state_is(pool: asyncpg.Pool, tenant: uuid.UUID, task_id: uuid.UUID, state: str) -> bool:
    return (await tasks.get(pool, tenant, task_id)).state == state


async def test_G12_a_renewal_that_finds_the_lease_gone_cancels_the_handler(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    cancelled = asyncio.Event()

    async def handler(job: Job) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(seconds=1))
    worker = Worker(pool, {"t": handler}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "running"))
        # The worker's own heartbeat may renew between our expiry and the
        # rescuer's claim; expire again until the take-over lands.
        for _ in range(50):
            await F.expire_lease(admin_conn, task.id)
            if await leases.claim(pool, "rescuer"):
                break
        await asyncio.wait_for(cancelled.wait(), 10)
        await _until(lambda: _lease_lost(worker))
    assert (await tasks.get(pool, tenants.a, task.id)).lease_owner == "rescuer"


async def _lease_lost(worker: Worker) -> bool:
    # On Citus, where each claim is a round trip more, the worker itself may take
    # its expired task over (and lose that lease too) before the rescuer's claim lands.
    return worker.stats.lease_lost >= 1 if ON_CITUS else worker.stats.lease_lost == 1


async def test_G12_the_heartbeat_renews_each_lease_well_before_it_runs_out(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Read from the lease row: each renewal lands while the previous lease still had time.

    A renewal at ``now()`` sets ``lease_expires_at = now() + ttl``, so the server
    time of each renewal is ``new expiry - ttl``; renewing every TTL would land
    after the previous expiry, every TTL/3 lands with two thirds of it left.
    """
    ttl = timedelta(seconds=3)
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        await release.wait()

    task = await tasks.create(pool, tenants.a, "t", lease_ttl=ttl)
    worker = Worker(pool, {"t": handler}, poll_interval=0.05)
    expiries: list[object] = []
    async with running(worker):
        while len(expiries) < 4:
            row = await tasks.get(pool, tenants.a, task.id)
            if row.lease_expires_at is not None and row.lease_expires_at not in expiries:
                expiries.append(row.lease_expires_at)
            await asyncio.sleep(0.02)
        release.set()
    pairs = list(itertools.pairwise(expiries))
    assert len(pairs) == 3
    for previous, renewed in pairs:
        renewed_at = renewed - ttl  # type: ignore[operator]
        assert renewed_at < previous, (previous, renewed)  # type: ignore[operator]
    assert worker.stats.lease_lost == 0


async def test_G12_a_heartbeat_that_cannot_renew_stops_the_handler_once_the_lease_is_gone(
    pool: asyncpg.Pool, tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals keep failing transiently (the database is unreachable): once the lease has
    expired the worker must assume it was taken over and stop the handler."""
    cancelled = asyncio.Event()
    renewals = 0

    async def unreachable(db: object, lease: Lease, **kw: object) -> Lease:
        nonlocal renewals
        renewals += 1
        raise TransientError("lost the database connection: test")

    async def handler(job: Job) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(leases, "renew", unreachable)
    # One attempt only, so the worker cannot reclaim the task itself once the lease expires.
    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(seconds=1), max_attempts=1)
    worker = Worker(pool, {"t": handler}, poll_interval=0.05, maintenance_interval=3600)
    async with running(worker):
        await asyncio.wait_for(cancelled.wait(), 15)
        await _until(lambda: _lease_lost(worker))
    assert renewals >= 2  # it did retry while the lease was still valid
    # It wrote nothing after stopping: the task is left running for a rescuer to reclaim.
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.lease_token, now.state_version) == ("running", 1, 1)


async def test_G13_no_transaction_is_open_while_the_provider_is_called(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The provider looks, from its own connection, at every backend of the test database."""
    open_tx = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
    )
    seen: list[int] = []

    async def provider() -> str:
        seen.append(await admin_conn.fetchval(open_tx))
        return "ref-1"

    async def handler(job: Job) -> None:
        res = await job.reserve("charge-1", "charge", {"amount": 5})
        assert res.fresh
        ref = await provider()
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)

    # Control: the check does see a transaction left open on another connection.
    other = await db.connect("agentdb_test_runtime")
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1")
        assert await admin_conn.fetchval(open_tx) == 1
        await tx.rollback()
    finally:
        await other.close()

    task = await tasks.create(pool, tenants.a, "t")
    worker = Worker(pool, {"t": handler}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
    assert seen == [0]


async def test_G4_a_key_held_by_another_tasks_unsettled_operation_is_in_flight_not_recovered(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Recovery is for this task's own crashed attempts; another task's operation is left alone."""
    hook_calls: list[uuid.UUID] = []

    async def lookup(op: Operation) -> Reconciled | None:
        hook_calls.append(op.id)
        return None

    other = await tasks.create(pool, tenants.a, "other")
    theirs = await operations.reserve(pool, tenants.a, other.id, "shared-key", "charge", {"n": 1})
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w", task_types=["t"])
    job = Job(pool, claimed, reconcilers={"charge": lookup})
    before = await admin_conn.fetchrow(
        "SELECT * FROM agent_operations WHERE id = $1", theirs.operation.id
    )
    with pytest.raises(OperationInFlight) as busy:
        await job.reserve("shared-key", "charge", {"n": 1})
    assert busy.value.operation.id == theirs.operation.id
    assert hook_calls == []
    after = await admin_conn.fetchrow(
        "SELECT * FROM agent_operations WHERE id = $1", theirs.operation.id
    )
    assert after == before


async def test_G13_an_attempt_that_stops_marks_its_unsettled_reservations_unknown(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The provider may have been called before the handler raised: the retry must see
    'unknown' and reconcile, never find a plain 'reserved' it could take for untouched."""

    async def handler(job: Job) -> None:
        await job.reserve("charge-1", "charge", {"amount": 5})
        raise TimeoutError("the provider did not answer")

    task = await tasks.create(pool, tenants.a, "t")
    worker = Worker(pool, {"t": handler}, poll_interval=0.05, retry_base=60)
    async with running(worker):
        await _until(lambda: _retried(worker))
    assert await admin_conn.fetchval("SELECT state FROM agent_operations") == "unknown"
    assert (await tasks.get(pool, tenants.a, task.id)).state == "pending"


async def test_retries_with_backoff_then_dead(pool: asyncpg.Pool, tenants: Tenants) -> None:
    calls = 0

    async def flaky(job: Job) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("model returned garbage")

    task = await tasks.create(pool, tenants.a, "t", max_attempts=3)
    worker = Worker(pool, {"t": flaky}, poll_interval=0.05, retry_base=0.01)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "dead"))
    done = await tasks.get(pool, tenants.a, task.id)
    assert (calls, done.attempts) == (3, 3)
    assert done.last_error is not None
    assert "model returned garbage" in done.last_error


@pytest.mark.parametrize("cap", [None, 1.0])
async def test_a_retry_waits_at_most_the_cap(
    cap: float | None, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """retry_base 60 s: the first retry waits a minute (+/- jitter) - or at most the cap."""

    async def flaky(job: Job) -> None:
        raise RuntimeError("503")

    task = await tasks.create(pool, tenants.a, "t", max_attempts=5)
    worker = (
        Worker(pool, {"t": flaky}, poll_interval=0.05, retry_base=60)
        if cap is None
        else Worker(pool, {"t": flaky}, poll_interval=0.05, retry_base=60, retry_cap=cap)
    )
    async with running(worker):
        await _until(lambda: _retried_once(pool, tenants.a, task.id))
    wait = await admin_conn.fetchval(
        "SELECT extract(epoch FROM wake_at - updated_at) FROM agent_tasks WHERE id = $1", task.id
    )
    if cap is None:
        assert 40 < wait < 80  # 60 s +/- 20 %
    else:
        assert wait < 10  # at most 1.2 s by the cap; far from the uncapped minute


async def _retried_once(pool: asyncpg.Pool, tenant: uuid.UUID, task_id: uuid.UUID) -> bool:
    t = await tasks.get(pool, tenant, task_id)
    return t.state == "pending" and t.attempts == 1


async def test_outcomes_fail_and_retry(pool: asyncpg.Pool, tenants: Tenants) -> None:
    async def give_up(job: Job) -> Fail:
        return Fail("customer closed the account")

    seen = 0

    async def later(job: Job) -> Retry | None:
        nonlocal seen
        seen += 1
        return Retry("not yet", after=timedelta(milliseconds=10)) if seen == 1 else None

    a = await tasks.create(pool, tenants.a, "give_up")
    b = await tasks.create(pool, tenants.a, "later")
    worker = Worker(pool, {"give_up": give_up, "later": later}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, a.id, "failed"))
        await _until(lambda: _state_is(pool, tenants.a, b.id, "succeeded"))
    assert (await tasks.get(pool, tenants.a, b.id)).attempts == 2


async def test_G13_an_operation_left_by_a_crashed_attempt_is_reconciled_not_rerun(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    provider_calls: list[str] = []
    ledger = {"crashed-key": "ref-from-first-attempt"}

    async def lookup(op: Operation) -> Reconciled | None:
        ref = ledger.get(op.idempotency_key)
        return Reconciled(True, ref, {"ref": ref}) if ref else None

    async def handler(job: Job) -> None:
        res = await job.reserve("crashed-key", "charge", {"amount": 5})
        if res.fresh:
            provider_calls.append("charge")
            await job.complete(res.operation, result={"ref": "new"})

    # Attempt 1 reserved the key, called the provider, then died (SIGKILL-like: nothing recorded).
    task = await tasks.create(pool, tenants.a, "t")
    [first] = await leases.claim(pool, "crashed-worker")
    await operations.reserve(
        pool, tenants.a, task.id, "crashed-key", "charge", {"amount": 5}, lease=first.lease
    )
    await F.expire_lease(admin_conn, task.id)

    worker = Worker(pool, {"t": handler}, reconcilers={"charge": lookup}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
    assert provider_calls == []  # the effect was found, not repeated
    [op] = await admin_conn.fetch("SELECT state, provider_reference FROM agent_operations")
    assert (op["state"], op["provider_reference"]) == ("succeeded", "ref-from-first-attempt")
    assert worker.stats.reconciled == 1


async def test_G13_without_a_reconcile_hook_the_provider_is_called_again_with_the_key(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    keys: list[str] = []

    async def handler(job: Job) -> None:
        res = await job.reserve("k", "wire", {"eur": 1})
        if res.fresh:
            keys.append(res.operation.idempotency_key)
            await job.complete(res.operation, result={"ok": True}, provider_reference="w-1")

    task = await tasks.create(pool, tenants.a, "t")
    [first] = await leases.claim(pool, "crashed-worker")
    await operations.reserve(pool, tenants.a, task.id, "k", "wire", {"eur": 1}, lease=first.lease)
    await F.expire_lease(admin_conn, task.id)
    worker = Worker(pool, {"t": handler}, poll_interval=0.05, retry_base=60)
    async with running(worker):
        await _until(lambda: _succeeded(worker))
    assert keys == ["k"]  # called again - with the key the crashed attempt was given
    events = await admin_conn.fetch(
        "SELECT event_type, payload FROM agent_events WHERE operation_id IS NOT NULL ORDER BY id"
    )
    assert [e["event_type"] for e in events] == [
        "operation.reserved", "operation.unknown", "operation.started", "operation.succeeded",
    ]  # fmt: skip


async def _succeeded(worker: Worker) -> bool:
    return worker.stats.succeeded >= 1


async def _retried(worker: Worker) -> bool:
    return worker.stats.retried >= 1


async def test_G13_an_action_declared_manual_is_surfaced_as_unknown_and_parked(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    calls = 0

    async def handler(job: Job) -> None:
        nonlocal calls
        res = await job.reserve("k", "wire", {"eur": 1})
        calls += 1 if res.fresh else 0

    task = await tasks.create(pool, tenants.a, "t")
    [first] = await leases.claim(pool, "crashed-worker")
    await operations.reserve(pool, tenants.a, task.id, "k", "wire", {"eur": 1}, lease=first.lease)
    await F.expire_lease(admin_conn, task.id)
    worker = Worker(pool, {"t": handler}, reconcilers={"wire": MANUAL}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _parked(worker))
    assert calls == 0
    assert await admin_conn.fetchval("SELECT state FROM agent_operations") == "unknown"
    later = await tasks.get(pool, tenants.a, task.id)
    assert later.state == "pending"  # parked: back in a minute, its attempt given back
    assert later.attempts == 1  # the crashed claim's; the parked run's was refunded
    assert "parked" in (later.last_error or "")


async def test_G13_a_key_reserved_twice_in_one_attempt_is_in_flight(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The attempt that reserved a key holds its call: reserving it again in the same run is
    not a crashed attempt's operation to call again, it is in flight."""
    task = await tasks.create(pool, tenants.a, "t")
    [held] = await leases.claim(pool, "w")
    job = Job(pool, held, reconcilers={})
    first = await job.reserve("k", "wire", {"eur": 1})
    assert first.fresh
    with pytest.raises(OperationInFlight):
        await job.reserve("k", "wire", {"eur": 1})
    assert (await operations.get(pool, tenants.a, first.operation.id)).state == "reserved"
    assert task.id == held.id


async def _parked(worker: Worker) -> bool:
    return worker.stats.parked >= 1


# ---- processes --------------------------------------------------------------------


def _spawn(db: Database, *args: str, marker: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if marker is not None:
        env["AGENTDB_TEST_MARKER"] = str(marker)
    return subprocess.Popen(
        [sys.executable, "-m", "agentdb", *args, "--dsn", db.url("agentdb_test_runtime")],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_G12_sigterm_releases_leases_so_another_worker_starts_at_once(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    task = await tasks.create(pool, tenants.a, "slow", lease_ttl=timedelta(minutes=30))
    code, err = await _sigterm_once_started(db, "tests.fixture_handlers:HANDLERS", tmp_path)
    assert code == 0, err
    # Long before the 30-minute lease would expire, the task is due again.
    [again] = await leases.claim(pool, "next-worker")
    assert (again.id, again.lease_token, again.attempts) == (task.id, 2, 1)


async def test_G12_a_handler_that_ignores_its_cancellation_does_not_keep_the_worker_from_exiting(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Its lease is released, then the process exits without it: the event loop would
    wait for it for ever."""
    task = await tasks.create(pool, tenants.a, "stubborn", lease_ttl=timedelta(minutes=30))
    code, err = await _sigterm_once_started(db, "tests.fixture_handlers:STUBBORN", tmp_path)
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "exiting without 1 handler(s) that ignore cancellation" in err, err
    [again] = await leases.claim(pool, "next-worker")
    assert (again.id, again.lease_token, again.attempts) == (task.id, 2, 1)


async def test_a_worker_process_plans_each_statement_once_per_session(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """``agentdb worker``'s pool forces generic plans (create_pool's ``generic_plans``):
    its connections run the same statements all day, and a custom plan per execution was
    a quarter of their statement time. A pool opened without it keeps the server's
    default (the control)."""
    await tasks.create(pool, tenants.a, "plan_mode")
    marker = tmp_path / "mode"
    proc = _spawn(db, "worker", "tests.fixture_handlers:PLAN_MODE", "--poll-interval", "0.1",
                  marker=marker)  # fmt: skip
    try:
        await _until(lambda: _written(marker))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    # Citus cannot plan a multi-shard statement with parameters generically: there
    # the pool leaves the server's default.
    assert marker.read_text() == ("auto" if ON_CITUS else "force_generic_plan")
    assert await pool.fetchval("SELECT current_setting('plan_cache_mode')") == "auto"


async def test_generic_plans_is_a_session_setting_except_behind_a_transaction_pooler(
    db: Database,
) -> None:
    url = db.url("agentdb_test_runtime")
    for pooler, generic, expected in (
        ("none", True, "auto" if ON_CITUS else "force_generic_plan"),
        ("none", False, "auto"),
        # PgBouncer refuses a startup parameter it does not track, and there every
        # statement is unnamed, planned at each execution anyway.
        ("transaction", True, "auto"),
    ):
        p = await _db.create_pool(url, min_size=2, max_size=2, pooler=pooler,
                                  generic_plans=generic)  # fmt: skip
        try:
            async with p.acquire() as a, p.acquire() as b:
                got = [await c.fetchval("SELECT current_setting('plan_cache_mode')")
                       for c in (a, b)]  # fmt: skip
        finally:
            await p.close()
        assert got == [expected, expected], (pooler, generic)


def test_the_relay_command_opens_its_pool_with_generic_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The relay's publisher never sees its pool, so the command's call is checked.
    from agentdb.tools import processes
    from agentdb.tools.cli import build_parser

    seen: dict[str, object] = {}

    def fake_run_with_pool(dsn: str, size: int, body: object, **kw: object) -> None:
        seen.update(kw)

    monkeypatch.setattr(processes, "run_with_pool", fake_run_with_pool)
    monkeypatch.setattr(processes, "setup_logging", lambda args: None)
    args = build_parser().parse_args(
        ["relay", "tests.fixture_handlers:quiet_publisher", "--dsn", "postgresql://x@127.0.0.1/y"]
    )
    assert args.func(args) == 0
    assert seen["generic_plans"] is True


async def _sigterm_once_started(db: Database, handlers: str, tmp_path: Path) -> tuple[int, str]:
    """``agentdb worker`` with ``handlers`` (grace 0.5 s), sent SIGTERM once a handler has
    started; its exit status and stderr (killed, and the test failing, after 60 s)."""
    marker = tmp_path / "started"
    proc = _spawn(
        db, "worker", handlers, "--poll-interval", "0.1", "--shutdown-grace", "0.5",
        marker=marker,
    )  # fmt: skip
    try:
        await _until(lambda: _exists(marker))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def _written(path: Path) -> bool:
    return await _exists(path) and await asyncio.to_thread(path.read_text) != ""


def test_bad_handler_module_is_one_line(db: Database) -> None:
    for spec, fragment in [
        ("no_such_module:HANDLERS", "cannot import handler module 'no_such_module'"),
        ("tests.fixture_handlers:MISSING", "has no attribute 'MISSING'"),
        ("tests.fixture_handlers:NOT_A_DICT", "must be a non-empty dict"),
        ("nocolon", "MODULE:ATTRIBUTE"),
    ]:
        proc = _spawn(db, "worker", spec)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, err
        assert err.startswith("agentdb: ")
        assert err.count("\n") == 1, err
        assert fragment in err


def test_a_handler_module_that_fails_at_import_names_its_file_and_line(
    db: Database, tmp_path: Path
) -> None:
    """Where the user's module broke, in the one line: the SyntaxError's place, or the last
    frame of the user's code (here in a module the handler module imports)."""
    (tmp_path / "h_syntax.py").write_text("HANDLERS = {\n    'a': lambda job: None,\n  oops\n}\n")
    (tmp_path / "h_helper.py").write_text("import json\n\n\nCONFIG = json.loads('{')\n")
    (tmp_path / "h_runtime.py").write_text("import h_helper\n\nHANDLERS = {}\n")
    for spec, where in [
        ("h_syntax:HANDLERS", f"{tmp_path / 'h_syntax.py'}:3: SyntaxError: "),
        ("h_runtime:HANDLERS", f"{tmp_path / 'h_helper.py'}:4: JSONDecodeError: "),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "agentdb", "worker", spec, "--dsn", db.admin_dsn],
            env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"), cwd=tmp_path,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"agentdb: cannot import handler module {spec[:-9]!r}: ")
        assert where in proc.stderr, proc.stderr


async def test_unknown_task_type_is_reported_and_left_pending(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    stray = await tasks.create(pool, tenants.a, "nobody_handles_me")
    marker = tmp_path / "started"
    slow = await tasks.create(pool, tenants.a, "slow")
    proc = _spawn(
        db, "worker", "tests.fixture_handlers:HANDLERS", "--poll-interval", "0.1", marker=marker
    )
    try:
        # The worker reports unhandled types before its first claim; the handled task
        # starting shows that moment has passed.
        await _until(lambda: _exists(marker))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "1 due task(s) of type 'nobody_handles_me' have no handler in this worker" in err
    assert "Traceback" not in err
    assert (await tasks.get(pool, tenants.a, stray.id)).state == "pending"  # nothing lost
    assert (await tasks.get(pool, tenants.a, slow.id)).state == "pending"  # released


async def test_G4_a_handler_reusing_a_key_for_other_input_fails_the_task_at_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    async def confused(job: Job) -> None:
        await job.reserve("same-key", "charge", {"amount": 1})
        await job.reserve("same-key", "charge", {"amount": 2})

    task = await tasks.create(pool, tenants.a, "t", max_attempts=5)
    worker = Worker(pool, {"t": confused}, poll_interval=0.05)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "failed"))
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.attempts == 1  # not retried: a conflict cannot go away
    assert done.last_error is not None
    assert done.last_error.startswith("IdempotencyConflict")
