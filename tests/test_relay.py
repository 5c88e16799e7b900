"""The relay (G10, G11): at least once, consumers dedupe, LISTEN optional, failures kept."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from agentdb import inbox, outbox
from agentdb.errors import TransientError
from agentdb.models import OutboxMessage
from agentdb.relay import Relay
from tests._pg import ON_CITUS
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent


async def _enqueue(pool: asyncpg.Pool, tenant: uuid.UUID, n: int, **kw: object) -> list[uuid.UUID]:
    async with pool.acquire() as conn:
        return [await outbox.enqueue(conn, tenant, "t", {"n": i}, **kw) for i in range(n)]  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(relay: Relay) -> AsyncIterator[None]:
    runner = asyncio.create_task(relay.run(install_signals=False))
    try:
        yield
    finally:
        relay.stop()
        await asyncio.wait_for(runner, 30)


async def _drain_settled(relay: Relay, pool: asyncpg.Pool, within: float = 15.0) -> None:
    """Drain, including retries whose short backoff has not passed yet."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        await relay.drain()
        if not await pool.fetchval("SELECT count(*) FROM agent_outbox WHERE state = 'pending'"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("outbox did not settle")


async def _until(predicate: object, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def test_G11_at_least_once_delivery_is_absorbed_by_the_consumer_inbox(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    ids = await _enqueue(pool, tenants.a, 20)
    effects: list[uuid.UUID] = []
    redelivered: list[uuid.UUID] = []
    acks_to_lose = set(ids[::3])

    async def publish(message: OutboxMessage) -> None:
        async def apply(conn: object) -> None:
            effects.append(message.id)

        first, _ = await inbox.process_once(pool, message.tenant_id, "ledger", message.id, apply)
        if not first:
            redelivered.append(message.id)
        if message.id in acks_to_lose:
            acks_to_lose.discard(message.id)
            raise TimeoutError("ack lost after the consumer applied it")

    relay = Relay(pool, publish, retry_base=0.001)
    await _drain_settled(relay, pool)
    assert relay.stats.delivered == 20
    assert sorted(effects) == sorted(ids)  # every message applied exactly once
    assert sorted(redelivered) == sorted(ids[::3])  # the relay did publish those twice
    assert relay.stats.failed_attempts == len(ids[::3])


async def test_G10_polling_alone_delivers(pool: asyncpg.Pool, tenants: Tenants) -> None:
    got: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        got.append(message.id)

    relay = Relay(pool, publish, poll_interval=0.1, listen_dsn=None)
    async with running(relay):
        ids = await _enqueue(pool, tenants.a, 5)

        async def all_in() -> bool:
            return sorted(got) == sorted(ids)

        await _until(all_in)


async def test_G10_listen_unavailable_falls_back_to_polling(
    pool: asyncpg.Pool, tenants: Tenants, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        got.append(message.id)

    relay = Relay(pool, publish, poll_interval=0.1, listen_dsn="postgresql://nobody@127.0.0.1:1/x")
    with caplog.at_level(logging.WARNING, logger="agentdb.listen"):
        async with running(relay):
            ids = await _enqueue(pool, tenants.a, 3)

            async def all_in() -> bool:
                return sorted(got) == sorted(ids)

            await _until(all_in)
    assert any("LISTEN agentdb_outbox unavailable" in r.getMessage() for r in caplog.records)


@pytest.mark.plain_postgres(
    "agentdb_distribute() drops the NOTIFY triggers on Citus (they would fire on a worker, "
    "where no listener hears them, and make it refuse PREPARE TRANSACTION): relays poll there"
)
async def test_G10_notify_wakes_an_idle_relay(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    got: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        got.append(message.id)

    relay = Relay(pool, publish, poll_interval=60, listen_dsn=db.url("agentdb_test_runtime"))
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query = 'LISTEN \"agentdb_outbox\"'"
    )
    async with running(relay):

        async def idle() -> bool:
            # Its LISTEN is in place: from now on a NOTIFY cannot be missed.
            return bool(await pool.fetchval(listening))

        await _until(idle)
        [mid] = await _enqueue(pool, tenants.a, 1)

        async def arrived() -> bool:
            return got == [mid]

        await _until(arrived, within=10)


async def test_G10_a_raising_publisher_loses_nothing(
    pool: asyncpg.Pool, tenants: Tenants, caplog: pytest.LogCaptureFixture
) -> None:
    async def publish(message: OutboxMessage) -> None:
        raise ConnectionError("broker down")

    [mid] = await _enqueue(pool, tenants.a, 1, max_attempts=2)
    relay = Relay(pool, publish, retry_base=0.001)
    with caplog.at_level(logging.WARNING, logger="agentdb.relay"):
        await _drain_settled(relay, pool)
    state = await outbox.get(pool, tenants.a, mid)
    assert (state.state, state.attempts) == ("dead", 2)
    assert state.last_error == "ConnectionError: broker down"
    lines = [r.getMessage() for r in caplog.records]
    assert sum("failed, attempt" in line for line in lines) == 2
    assert any("is dead after 2 attempts" in line for line in lines)


class _OwnBase(BaseException):
    pass


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


@pytest.mark.parametrize(
    ("raised", "recorded"),
    [
        (asyncio.CancelledError(), "CancelledError: the publisher was cancelled, not by the relay"),
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit: "),
        (_OwnBase("its own"), "_OwnBase: its own"),
        (_Unprintable(), "_Unprintable: (its str() raised)"),
        (ConnectionError("broker \x00 said \udc80"), "ConnectionError: broker \\x00 said \\udc80"),
    ],
    ids=["CancelledError", "SystemExit", "GeneratorExit", "own-BaseException", "unprintable",
         "nul-and-surrogate"],
)  # fmt: skip
async def test_G10_a_publisher_failing_in_any_way_is_one_failed_publish_and_the_relay_goes_on(
    raised: BaseException, recorded: str, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Each ended the relay (a BaseException, or an error describing itself), or left the
    failure unrecorded (text Postgres refuses): the message was claimed again and again,
    its attempts spent with nothing said, by every relay that took it."""
    [bad, good] = await _enqueue(pool, tenants.a, 2)

    async def publish(message: OutboxMessage) -> None:
        if message.id == bad:
            raise raised

    relay = Relay(pool, publish, retry_base=30, publish_concurrency=2)
    assert await relay.run_once() == 2
    failed = await outbox.get(pool, tenants.a, bad)
    assert (failed.state, failed.attempts, failed.last_error) == ("pending", 1, recorded)
    assert (await outbox.get(pool, tenants.a, good)).state == "delivered"
    await _enqueue(pool, tenants.a, 1)
    async with running(Relay(pool, publish, retry_base=30, poll_interval=0.05)):
        await _until(
            lambda: pool.fetchval("SELECT count(*) = 2 FROM agent_outbox WHERE state = 'delivered'")
        )


async def test_G10_a_publish_slower_than_the_visibility_is_cut_off_and_recorded(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Two relays, a publish that never ends, a 1 s visibility: the message used to be
    published again and again by both (each lease ran out mid-publish, every mark was
    fenced out) and a hung publisher kept the relay from stopping."""
    [slow, fast] = await _enqueue(pool, tenants.a, 2)
    hang = asyncio.Event()
    started: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        started.append(message.id)
        if message.id == slow:
            await hang.wait()  # never set

    first = Relay(pool, publish, visibility=timedelta(seconds=1), retry_base=30)
    second = Relay(pool, publish, visibility=timedelta(seconds=1), retry_base=30)
    assert await asyncio.wait_for(first.run_once(), 30) == 2  # a hang guard, not a timing
    assert await second.run_once() == 0  # backed off, not claimable
    cut = await outbox.get(pool, tenants.a, slow)
    assert (cut.state, cut.attempts) == ("pending", 1)
    assert cut.last_error is not None
    assert cut.last_error.startswith("TimeoutError: not published")
    assert (await outbox.get(pool, tenants.a, fast)).state == "delivered"  # control
    assert started.count(slow) == 1
    # A relay whose publisher hangs still stops.
    await _enqueue(pool, tenants.a, 1)
    async with running(Relay(pool, publish, visibility=timedelta(seconds=1), poll_interval=0.05)):
        await _until(lambda: pool.fetchval(
            "SELECT count(*) = 2 FROM agent_outbox WHERE state = 'delivered'"
        ))  # fmt: skip


async def test_G10_a_failed_message_backs_off_and_is_not_claimed_again_at_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    async def publish(message: OutboxMessage) -> None:
        raise ConnectionError("broker down")

    [mid] = await _enqueue(pool, tenants.a, 1)
    relay = Relay(pool, publish, retry_base=30)
    assert await relay.run_once() == 1
    state = await outbox.get(pool, tenants.a, mid)
    assert (state.state, state.attempts, state.delivered_at) == ("pending", 1, None)
    wait = await pool.fetchval("SELECT $1::timestamptz - now()", state.next_attempt_at)
    assert wait.total_seconds() > 20  # 30 s +/- 20 % jitter
    assert await relay.run_once() == 0  # still backing off


async def test_G10_G11_concurrent_relays_publish_each_message_once(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Three relays on their own connections drain one outbox at once: SKIP LOCKED keeps their
    claims disjoint, so without failures nothing is published twice."""
    ids = await _enqueue(pool, tenants.a, 300)
    published: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        published.append(message.id)
        await asyncio.sleep(0)  # let the other relays claim meanwhile

    pools = [
        await asyncpg.create_pool(db.url("agentdb_test_runtime"), min_size=1, max_size=2)
        for _ in range(3)
    ]
    try:
        relays = [Relay(p, publish, batch=20) for p in pools]
        await asyncio.gather(*(r.drain() for r in relays))
    finally:
        for p in pools:
            await p.close()
    assert sorted(published) == sorted(ids)
    assert sum(r.stats.delivered for r in relays) == 300
    assert all(r.stats.delivered > 0 for r in relays)  # they really shared the work
    assert await pool.fetchval("SELECT count(*) FROM agent_outbox WHERE state = 'delivered'") == 300


def test_G10_a_poison_message_that_kills_its_relay_every_time_goes_dead_the_rest_delivered(
    db: Database, tenants: Tenants
) -> None:
    """Real relay processes, SIGKILLed by their publisher on one message, restarted as a
    supervisor would: no failure is ever recorded for it, so only the claim can bury it -
    after its 3 attempts, not on a 4th. Every other message ends delivered."""
    import psycopg

    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_outbox (tenant_id, topic, max_attempts) VALUES (%s, 'poison', 3)",
            (tenants.a,),
        )
        conn.execute(
            "INSERT INTO agent_outbox (tenant_id, topic)"
            " SELECT %s, 'fine' FROM generate_series(1, 20)",
            (tenants.a,),
        )
    argv = [sys.executable, "-m", "agentdb", "relay", "tests.fixture_handlers:poison_publisher",
            "--dsn", db.url("agentdb_test_runtime"), "--poll-interval", "0.1", "--batch", "5",
            "--visibility", "1"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = 0
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        for _ in range(8):
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if conn.execute("SELECT count(*) FROM agent_outbox WHERE state = 'pending'"
                                ).fetchone() == (0,):  # fmt: skip
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.05)
            _, err = proc.communicate(timeout=30)
            if proc.returncode == -signal.SIGKILL:
                killed += 1
                continue
            assert proc.returncode == 0, err
            break
        rows: dict[str, list[str]] = dict(conn.execute(
            "SELECT topic, array_agg(DISTINCT state || ':' || attempts) FROM agent_outbox"
            " GROUP BY topic"
        ).fetchall())  # fmt: skip
    assert killed == 3
    assert rows["poison"] == ["dead:3"]
    assert all(r.startswith("delivered:") for r in rows["fine"]), rows["fine"]
    assert "no outcome recorded for attempt 3 of 3" in err, err


def test_cli_relay_with_a_broken_publisher_logs_one_line_per_failure(
    db: Database, tenants: Tenants
) -> None:
    import psycopg

    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_outbox (tenant_id, topic) VALUES (%s, 't')", (tenants.a,))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "relay", "tests.fixture_handlers:broken_publisher",
         "--dsn", db.url("agentdb_test_runtime"), "--poll-interval", "0.1", "--retry-base", "60"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Wait for the first failed attempt to be recorded, then stop the relay.
    deadline = time.monotonic() + 30
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        while conn.execute("SELECT attempts FROM agent_outbox").fetchone() != (1,):
            assert time.monotonic() < deadline, "the relay never tried"
            time.sleep(0.05)
        while conn.execute("SELECT last_error IS NOT NULL FROM agent_outbox").fetchone() != (True,):
            assert time.monotonic() < deadline, "the failure was never recorded"
            time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    failures = [line for line in err.splitlines() if "failed, attempt 1 of 20" in line]
    assert len(failures) == 1
    assert "ConnectionError: broker refused the connection" in failures[0]
    with psycopg.connect(db.admin_dsn) as conn:
        row = conn.execute("SELECT state, attempts FROM agent_outbox").fetchone()
    assert row == ("pending", 1)  # kept for the next attempt


def test_bad_publisher_module_is_one_line(db: Database) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentdb", "relay", "tests.fixture_handlers:NOT_A_DICT",
         "--dsn", db.admin_dsn],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "is not an async callable" in proc.stderr


def test_demo_against_a_database_kills_workers_and_loses_nothing(
    db: Database, tmp_path: Path
) -> None:
    """... and a run that passed removes its worker and relay logs (kept only for a failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentdb", "demo", "--dsn", db.admin_dsn, "--tasks", "60",
         "--workers", "2", "--relays", "1", "--kill-every", "0.3", "--seed", "7"],
        capture_output=True, text=True, check=False, timeout=300,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []
    report = dict(
        line.strip().rsplit("  ", 1) for line in proc.stdout.splitlines() if line.startswith("  ")
    )
    report = {k.strip(): v.strip() for k, v in report.items()}
    assert report["duplicate effects"] == "0"
    assert report["messages lost"] == "0"
    # Every task succeeded, or was stopped by the first tenant's budget (G19) - no other end.
    done = re.fullmatch(
        r"(\d+) of 60(?: \(0 dead, 0 failed, (\d+) stopped by a budget\))?",
        report["tasks completed"],
    )
    assert done is not None, report["tasks completed"]
    assert int(done.group(1)) + int(done.group(2) or 0) == 60
    assert report["overspent"].startswith("0 ")
    assert int(report["worker/relay processes killed (SIGKILL)"]) >= 1


def _count_calls(monkeypatch: pytest.MonkeyPatch, *names: str) -> dict[str, int]:
    """Count the calls of ``outbox.<name>`` (each still does its work)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(outbox, name)

        async def counted(
            *args: object, _real: object = real, _n: str = name, **kw: object
        ) -> object:
            calls[_n] += 1
            return await _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(outbox, name, counted)
    return calls


async def test_G10_a_relay_under_load_marks_and_claims_in_one_statement(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """35 messages, batches of 10: after each full batch the mark and the next claim are
    one statement (on plain Postgres); the short last batch is marked alone, at once.
    Each message is published once and ends delivered."""
    ids = await _enqueue(pool, tenants.a, 35)
    calls = _count_calls(monkeypatch, "_claim", "_deliver_and_claim", "mark_delivered")
    published: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = Relay(pool, publish, batch=10)
    assert await relay.drain() == 35
    assert sorted(published) == sorted(ids)
    if ON_CITUS:  # there deliver_and_claim is mark_delivered, then claim
        assert calls == {"_claim": 5, "_deliver_and_claim": 3, "mark_delivered": 4}
    else:
        assert calls == {"_claim": 2, "_deliver_and_claim": 3, "mark_delivered": 1}
    assert (relay.stats.claimed, relay.stats.delivered, relay.stats.lost_claims) == (35, 35, 0)
    states = await admin_conn.fetch("SELECT DISTINCT state FROM agent_outbox")
    assert [r["state"] for r in states] == ["delivered"]


async def test_G10_a_relay_stopped_after_marking_delivers_what_that_mark_claimed(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop comes as the mark of a full batch claims the next one: the relay publishes
    and marks that batch before it returns - nothing is left leased and unpublished until
    its visibility runs out."""
    await _enqueue(pool, tenants.a, 15)
    published: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = Relay(pool, publish, batch=10, poll_interval=0.05)
    real = outbox._deliver_and_claim

    async def then_stop(*args: object, **kw: object) -> object:
        answer = await real(*args, **kw)  # type: ignore[arg-type]
        relay.stop()
        return answer

    monkeypatch.setattr(outbox, "_deliver_and_claim", then_stop)
    await asyncio.wait_for(relay.run(install_signals=False), 30)
    assert len(published) == len(set(published)) == 15
    pending = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_outbox WHERE state <> 'delivered'"
    )
    assert pending == 0


async def test_G10_a_failed_mark_and_claim_is_marked_alone_and_the_relay_goes_on(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The merged statement fails once before it ran (a dropped connection): the batch it
    would have marked is marked alone, at once, and the relay claims on - every message
    is published once and ends delivered. (Had it failed after its commit, the batch it
    claimed would wait for its visibility to end, as after a relay's crash.)"""
    ids = await _enqueue(pool, tenants.a, 25)
    real = outbox._deliver_and_claim
    failures: list[int] = []

    async def fails_once(*args: object, **kw: object) -> object:
        if not failures:
            failures.append(1)
            raise TransientError("connection lost: test")
        return await real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(outbox, "_deliver_and_claim", fails_once)
    published: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = Relay(pool, publish, batch=10)
    assert await relay.drain() == 25
    assert failures == [1]
    assert sorted(published) == sorted(ids)
    assert relay.stats.lost_claims == 0
    states = await admin_conn.fetch("SELECT DISTINCT state FROM agent_outbox")
    assert [r["state"] for r in states] == ["delivered"]


async def test_G10_a_failure_is_recorded_before_the_next_claim_can_take_it_again(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A full batch whose publishes outlive the visibility (their publisher swallows the
    relay's cut-off): each failure is recorded (backed off, its error kept) before the
    merged mark-and-claim runs - which would otherwise lease the failed messages again
    and fence their record out - so both end dead after their two attempts, with nothing
    lost on the way."""
    await _enqueue(pool, tenants.a, 2, max_attempts=2)

    async def slow_failure(message: OutboxMessage) -> None:
        try:
            await asyncio.sleep(1.2)
        except asyncio.CancelledError:  # the cut-off, swallowed: it runs on past 1 s
            await asyncio.sleep(0.4)
        raise RuntimeError("downstream 503")

    relay = Relay(
        pool, slow_failure, batch=2, visibility=timedelta(seconds=1), retry_base=0.05,
        retry_cap=0.05,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while relay.stats.dead < 2:
        assert time.monotonic() < deadline, relay.stats
        if not await relay.run_once():
            await asyncio.sleep(0.05)
    rows = await admin_conn.fetch("SELECT state, attempts, last_error FROM agent_outbox")
    assert [(r["state"], r["attempts"]) for r in rows] == [("dead", 2), ("dead", 2)]
    assert all("downstream 503" in (r["last_error"] or "") for r in rows)
    assert (relay.stats.failed_attempts, relay.stats.lost_claims) == (4, 0)
