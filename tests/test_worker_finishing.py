"""Finishing writes that do not land, a fatal pooler, a confused heartbeat, and SIGTERM.

The database refuses the write, the connection is lost under it, it keeps
failing, even the release fails: the task still leaves 'running', by the
worker that ran it, within seconds - never at lease expiry. A write whose answer
was lost after it committed is found landed - on the last attempt too - and told
apart from another worker's finish. SIGTERM releases every lease still held,
mid-handler or mid-finish.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentdb import leases, tasks
from agentdb.errors import PoolerMismatch, TransientError
from agentdb.models import Lease, Message, Task
from agentdb.worker import Job, Retry, Succeed, Worker
from agentdb.worker.finish import WRITE_TRIES
from tests import factories as F
from tests.conftest import Database, Tenants
from tests.test_worker import (
    _exists,
    _spawn,
    _state_is,
    _until,
    asyncio_errors,  # noqa: F401 - autouse: guards these tests too
    running,
)
from tests.test_worker_misbehaving import (
    LONG,
    _events,
    _last_event_is,
    _ok,
    _outbox_rows,
    _serves_another,
    _worker,
)

# ---- finishing writes that do not land ---------------------------------------------


async def _waiting_for_outbox_lock(admin: asyncpg.Connection) -> list[int]:
    pids: list[int] = [
        r["pid"]
        for r in await admin.fetch(
            "SELECT pid FROM pg_locks WHERE NOT granted AND relation = 'agent_outbox'::regclass"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    ]
    return pids


@pytest.mark.plain_postgres(
    "the finishing write is held up by a LOCK TABLE on the coordinator's agent_outbox; on "
    "Citus the routed write goes to the tenant's shard on a worker, which that lock does not cover"
)
async def test_a_connection_dropped_during_the_finishing_write_is_retried_on_a_fresh_one(
    db: Database,
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The finishing write is held up (the test locks agent_outbox) and its backend is
    terminated while it waits: a real connection lost mid-statement."""

    async def done(job: Job) -> Succeed:
        return Succeed(payload={"n": 1}, outbox=(Message("fixture.done", {"n": 1}),))

    task = await tasks.create(pool, tenants.a, "bad")
    worker = _worker(pool, done)
    locker = await db.connect()
    try:
        held = locker.transaction()
        await held.start()
        await locker.execute("LOCK TABLE agent_outbox IN SHARE MODE")
        with caplog.at_level(logging.WARNING, logger="agentdb.worker"):
            async with running(worker):
                found: list[int] = []

                async def blocked() -> bool:
                    found[:] = await _waiting_for_outbox_lock(admin_conn)
                    return len(found) == 1

                await _until(blocked)
                assert await admin_conn.fetchval("SELECT pg_terminate_backend($1::int)", found[0])
                await held.rollback()
                await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
                await _serves_another(pool, tenants.a)
    finally:
        await locker.close()
    events = await _events(admin_conn, task.id)
    assert events.count("task.succeeded") == 1
    assert "task.released" not in events
    assert await _outbox_rows(admin_conn, task.id) == 1  # written once, by the retry
    assert (await tasks.get(pool, tenants.a, task.id)).last_error is None
    assert any("trying again on a fresh connection" in r.getMessage() for r in caplog.records)
    assert (worker.stats.succeeded, worker.stats.released_unfinished) == (2, 0)


def _refusing(
    task_id: uuid.UUID, *, owner: str | None = None, token: int | None = None
) -> tuple[Callable[..., Any], list[int]]:
    """``tasks.transition`` as seen by a worker that cannot reach the database for
    ``task_id`` while it holds it (by ``owner``, or under lease ``token``); everyone
    else is served."""
    real = tasks.transition
    calls = [0]

    async def transition(db: Any, tenant_id: uuid.UUID, tid: uuid.UUID, **kw: Any) -> Task:
        lease: Lease | None = kw.get("lease")
        if (
            tid == task_id
            and lease is not None
            and owner in (None, lease.owner)
            and token in (None, lease.token)
        ):
            calls[0] += 1
            raise TransientError("lost the database connection: test")
        return await real(db, tenant_id, tid, **kw)

    return transition, calls


async def test_a_finishing_write_that_keeps_failing_releases_the_lease_for_another_worker(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker (concurrency 1) moves on to a task due before the released one, so the
    rival that claims the released one is certainly another worker."""
    task = await tasks.create(pool, tenants.a, "ok", lease_ttl=LONG)
    after = await tasks.create(pool, tenants.a, "held")
    transition, calls = _refusing(task.id, owner="flaky")
    monkeypatch.setattr(tasks, "transition", transition)
    gate = asyncio.Event()

    async def held(job: Job) -> None:
        await gate.wait()

    worker = Worker(
        pool, {"ok": _ok, "held": held}, worker_id="flaky", concurrency=1, poll_interval=0.05
    )
    async with running(worker):
        await _until(lambda: _last_event_is(admin_conn, task.id, "task.released"))
        # Half an hour before the lease would have expired, another worker has it.
        [again] = await leases.claim(pool, "rival", task_types=["ok"])
        assert (again.id, again.lease_token, again.attempts) == (task.id, 2, 2)
        gate.set()
        await _until(lambda: _state_is(pool, tenants.a, after.id, "succeeded"))
    assert calls[0] == WRITE_TRIES
    assert again.last_error is not None
    assert again.last_error.startswith(
        f"finishing write failed {WRITE_TRIES} times: TransientError: lost the database"
    )
    assert (await _events(admin_conn, task.id))[-2:] == ["task.released", "task.claimed"]
    assert worker.stats.released_unfinished == 1


async def test_a_lease_the_worker_could_not_release_is_released_at_the_next_maintenance(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither the finishing write nor the release gets through at first; the lease is
    given back at the next maintenance round, not when it expires half an hour later."""
    task = await tasks.create(pool, tenants.a, "bad", lease_ttl=LONG)
    transition, _ = _refusing(task.id, token=1)  # the first attempt only
    monkeypatch.setattr(tasks, "transition", transition)
    real_release = leases.release
    releases = [0]

    async def release(db: Any, lease: Lease, **kw: Any) -> leases.Release:
        releases[0] += 1
        if releases[0] <= WRITE_TRIES:  # the whole first give-back fails
            raise TransientError("lost the database connection: test")
        return await real_release(db, lease, **kw)

    monkeypatch.setattr(leases, "release", release)
    worker = _worker(pool, _ok, maintenance_interval=0.2)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
        await _serves_another(pool, tenants.a)
    done = await tasks.get(pool, tenants.a, task.id)
    assert (done.attempts, done.lease_token) == (2, 2)
    assert done.last_error is not None
    assert done.last_error.startswith(f"finishing write failed {WRITE_TRIES} times")
    assert releases[0] == WRITE_TRIES + 1
    events = await _events(admin_conn, task.id)
    assert events[-3:] == ["task.released", "task.claimed", "task.succeeded"]
    assert events.count("task.released") == 1
    assert worker.stats.released_unfinished == 1


async def test_a_lease_the_worker_could_not_release_is_released_when_it_stops(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but the worker is stopped before any maintenance round: the shutdown
    releases the lease it could not give back (the runner that held it is long gone)."""
    task = await tasks.create(pool, tenants.a, "bad", lease_ttl=LONG)
    transition, _ = _refusing(task.id)
    monkeypatch.setattr(tasks, "transition", transition)
    real_release = leases.release
    releases = [0]

    async def release(db: Any, lease: Lease, **kw: Any) -> leases.Release:
        releases[0] += 1
        if releases[0] <= WRITE_TRIES:
            raise TransientError("lost the database connection: test")
        return await real_release(db, lease, **kw)

    async def gave_up() -> bool:
        return releases[0] == WRITE_TRIES and worker.stats.claimed == 1

    monkeypatch.setattr(leases, "release", release)
    worker = _worker(pool, _ok, maintenance_interval=3600)
    async with running(worker):
        await _until(gave_up)
        assert (await tasks.get(pool, tenants.a, task.id)).state == "running"
    done = await tasks.get(pool, tenants.a, task.id)
    assert (done.state, done.attempts, done.lease_owner) == ("pending", 1, None)
    assert done.last_error is not None
    assert done.last_error.startswith(f"finishing write failed {WRITE_TRIES} times")
    assert (await _events(admin_conn, task.id))[-1] == "task.released"


async def test_a_heartbeat_error_it_does_not_understand_neither_kills_it_nor_the_job(
    pool: asyncpg.Pool, tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    renewals = [0]
    enough = asyncio.Event()

    async def broken(db: object, lease: Lease, **kw: object) -> Lease:
        renewals[0] += 1
        if renewals[0] >= 2:
            enough.set()
        raise RuntimeError("the driver did something new")

    async def patient(job: Job) -> None:
        await enough.wait()  # renewals keep being tried while the lease lasts

    monkeypatch.setattr(leases, "renew", broken)
    task = await tasks.create(pool, tenants.a, "bad", lease_ttl=timedelta(seconds=6))
    worker = _worker(pool, patient)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
        await _serves_another(pool, tenants.a)
    assert renewals[0] >= 2
    assert worker.stats.lease_lost == 0


# ---- finishing writes whose answer was lost ----------------------------------------


def _answer_lost_once(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, task_id: uuid.UUID
) -> list[int]:
    """``module.name`` (a write that takes the task's lease: ``tasks.transition``,
    ``leases.release``): its first call for ``task_id`` commits, then raises as if the
    connection was lost before the answer came back; every other call is served."""
    real = getattr(module, name)
    lost: list[int] = []

    async def answer_lost(*args: Any, **kw: Any) -> Any:
        done = await real(*args, **kw)
        leases_given = [a for a in (*args, *kw.values()) if isinstance(a, Lease)]
        if not lost and any(lease.task_id == task_id for lease in leases_given):
            lost.append(1)
            raise TransientError("connection lost after the commit: test")
        return done

    monkeypatch.setattr(module, name, answer_lost)
    return lost


async def test_a_lone_success_on_the_last_attempt_whose_answer_was_lost_is_found_landed(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blind class of issue 35: a finishing write whose answer was lost, on the task's last
    attempt. The success commits alone (no group commit to share) and its answer is lost;
    the retry is refused by the fence and must find the success landed: succeeded once,
    nothing released, no attempt more, not dead. Kills reclaim-lone-lost-answer-not-checked."""

    async def done(job: Job) -> Succeed:
        return Succeed(payload={"n": 1}, outbox=(Message("fixture.done", {"n": 1}),))

    task = await tasks.create(pool, tenants.a, "bad", max_attempts=1, lease_ttl=LONG)
    lost = _answer_lost_once(monkeypatch, tasks, "transition", task.id)
    worker = _worker(pool, done)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
        await _serves_another(pool, tenants.a)
    assert lost == [1]
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.attempts, now.lease_owner, now.last_error) == (
        "succeeded",
        1,
        None,
        None,
    )
    assert (await _events(admin_conn, task.id))[-2:] == ["task.claimed", "task.succeeded"]
    assert await _outbox_rows(admin_conn, task.id) == 1
    s = worker.stats
    assert (s.succeeded, s.late_writes_refused, s.released_unfinished, s.failed) == (2, 0, 0, 0)


async def test_a_give_back_on_the_last_attempt_whose_answer_was_lost_is_found_dead(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blind class of issue 35: a finishing write whose answer was lost, on the task's last
    attempt. The handler asks for a retry; with no attempt left the release lands the task
    in 'dead', and its answer is lost. The retry of the release is refused (the lease is
    gone) and must find that 'dead' landed: counted as a task that died, not as a retry
    and not as a lease taken over; nothing written twice. Kills
    reclaim-lost-release-dead-not-landed."""

    async def again(job: Job) -> Retry:
        return Retry("the provider said later")

    task = await tasks.create(pool, tenants.a, "bad", max_attempts=1, lease_ttl=LONG)
    lost = _answer_lost_once(monkeypatch, leases, "release", task.id)
    worker = _worker(pool, again)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "dead"))
        await _serves_another(pool, tenants.a)
    assert lost == [1]
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.attempts, now.lease_owner) == ("dead", 1, None)
    assert now.last_error == "the provider said later"
    assert (await _events(admin_conn, task.id))[-2:] == ["task.claimed", "task.retry"]
    s = worker.stats
    assert (s.failed, s.retried, s.late_writes_refused, s.released_unfinished) == (1, 0, 0, 0)


async def test_a_last_attempt_released_after_its_finish_kept_failing_is_logged_dead(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Blind class of issue 35: a finishing write whose answer was lost, on the task's last
    attempt. The success never gets through, so the lease is given back - which, with no
    attempt left, lands the task in 'dead' - and the give-back's answer is lost too. Its
    retry finds the release landed, and the log says where the task is: dead, not
    pending. Kills reclaim-give-back-logged-pending."""
    task = await tasks.create(pool, tenants.a, "bad", max_attempts=1, lease_ttl=LONG)
    transition, calls = _refusing(task.id)
    monkeypatch.setattr(tasks, "transition", transition)
    lost = _answer_lost_once(monkeypatch, leases, "release", task.id)
    worker = _worker(pool, _ok)
    with caplog.at_level(logging.WARNING, logger="agentdb.worker"):
        async with running(worker):
            await _until(lambda: _state_is(pool, tenants.a, task.id, "dead"))
            await _serves_another(pool, tenants.a)
    assert (calls[0], lost) == (WRITE_TRIES, [1])
    assert (await _events(admin_conn, task.id))[-2:] == ["task.claimed", "task.released"]
    assert (worker.stats.released_unfinished, worker.stats.late_writes_refused) == (1, 0)
    released = [r.getMessage() for r in caplog.records if "lease released" in r.getMessage()]
    assert len(released) == 1
    assert f"task {task.id}: lease released (now dead)" in released[0]


async def test_a_finishing_write_lost_while_another_worker_took_over_is_a_late_write(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blind class of issue 35: a finishing write whose answer was lost while another worker
    moved the task. The success does not land; before its retry the lease runs out, a
    rival reclaims the task and finishes it. The retry is refused, and the task is
    'succeeded' with no lease - but two versions on, by the rival: the worker must count
    a late write refused, not its own success (nor release anything). Kills
    reclaim-landed-any-version."""
    task = await tasks.create(pool, tenants.a, "bad", lease_ttl=LONG)
    real = tasks.transition
    rival: list[Task] = []
    lost: list[int] = []

    async def transition(db: Any, tenant_id: uuid.UUID, tid: uuid.UUID, **kw: Any) -> Task:
        lease: Lease | None = kw.get("lease")
        if tid == task.id and lease is not None and lease.owner == "flaky" and not lost:
            lost.append(1)
            # The write is lost before it commits; meanwhile the lease runs out and the
            # rival takes the task over and finishes it.
            await F.expire_lease(admin_conn, task.id)
            [took] = await leases.claim(pool, "rival", task_types=["bad"])
            assert took.lease is not None
            rival.append(
                await real(
                    pool, tenants.a, task.id, expected_version=took.state_version,
                    to_state="succeeded", lease=took.lease,
                )
            )  # fmt: skip
            raise TransientError("lost the database connection: test")
        return await real(db, tenant_id, tid, **kw)

    monkeypatch.setattr(tasks, "transition", transition)
    # One slot, held by the finishing job: the worker cannot take its own expired task
    # over before the rival does.
    worker = _worker(pool, _ok, worker_id="flaky", concurrency=1)
    async with running(worker):
        await _until(lambda: _state_is(pool, tenants.a, task.id, "succeeded"))
        await _serves_another(pool, tenants.a)
    [theirs] = rival
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state_version, now.attempts, now.lease_token) == (theirs.state_version, 2, 2)
    events = await _events(admin_conn, task.id)
    assert events[-3:] == ["task.claimed", "task.reclaimed", "task.succeeded"]
    assert events.count("task.succeeded") == 1
    s = worker.stats
    assert (s.succeeded, s.late_writes_refused, s.released_unfinished) == (1, 1, 0)


MISMATCH = "a transaction-pooling proxy is in the way (test)"


async def _behind_a_pooler(*args: object, **kw: object) -> Any:
    raise PoolerMismatch(MISMATCH)


@pytest.mark.parametrize("where", ["finishing write", "handler"])
async def test_a_pooler_mismatch_stops_the_worker_and_releases_what_it_held(
    pool: asyncpg.Pool, tenants: Tenants, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == "finishing write":  # alone or group-committed (then alone, after the refusal)
        monkeypatch.setattr(tasks, "transition", _behind_a_pooler)
        monkeypatch.setattr(tasks, "finish_many", _behind_a_pooler)
    handler = _ok if where == "finishing write" else _behind_a_pooler
    ids = [(await tasks.create(pool, tenants.a, "bad", lease_ttl=LONG)).id for _ in range(3)]
    worker = _worker(pool, handler, concurrency=2)
    with pytest.raises(PoolerMismatch, match=re.escape(MISMATCH)):
        await asyncio.wait_for(worker.run(install_signals=False), 60)
    rows = [await tasks.get(pool, tenants.a, i) for i in ids]
    assert [r.state for r in rows] == ["pending"] * 3
    assert [r.attempts for r in rows] == [0] * 3  # not the tasks' fault: refunded
    released = [r.last_error for r in rows if r.last_error is not None]
    assert released
    assert set(released) == {f"worker stopped: {MISMATCH}"}


# ---- shutdown ----------------------------------------------------------------------


@pytest.mark.plain_postgres(
    "holds the finishing writes with LOCK TABLE agent_outbox on the coordinator; on Citus a "
    "transition is one call delegated to the tenant's worker (0021.delegated_writes), which "
    "never waits for a lock on the coordinator's table"
)
async def test_sigterm_leaves_nothing_running_with_jobs_in_handlers_and_in_finishing_writes(
    db: Database,
    tenants: Tenants,
    pool: asyncpg.Pool,
    admin_conn: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    """Two handlers sleep; two finishing writes wait for a lock on agent_outbox the test
    holds, in one statement (one flush of the group commit is in flight at a time: the
    second success waits for it or shares it). SIGTERM: after the grace all four are
    cancelled and released, refunded."""
    locker = await db.connect()
    try:
        held = locker.transaction()
        await held.start()
        await locker.execute("LOCK TABLE agent_outbox IN SHARE MODE")
        ids = [
            (await tasks.create(pool, tenants.a, kind, lease_ttl=LONG)).id
            for kind in ("slow", "slow", "finishing", "finishing")
        ]
        proc = _spawn(
            db, "worker", "tests.fixture_handlers:IN_FLIGHT", "--poll-interval", "0.1",
            "--shutdown-grace", "0.5", "--concurrency", "4", marker=tmp_path / "started",
        )  # fmt: skip
        try:

            async def in_flight() -> bool:
                running_now = await admin_conn.fetchval(
                    "SELECT count(*) FROM agent_tasks WHERE state = 'running'"
                )
                writes = await _waiting_for_outbox_lock(admin_conn)
                return running_now == 4 and len(writes) == 1

            await _until(in_flight, within=60)
            await _until(lambda: _exists(tmp_path / "started"))
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(proc.communicate, timeout=60)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        await held.rollback()
    finally:
        await locker.close()
    rows = [await tasks.get(pool, tenants.a, i) for i in ids]
    assert [r.state for r in rows] == ["pending"] * 4
    assert [(r.attempts, r.last_error) for r in rows] == [(0, "worker shut down")] * 4
    assert await pool.fetchval("SELECT count(*) FROM agent_outbox") == 0
    for bad in ("never retrieved", "never awaited", "Traceback"):
        assert bad not in err
