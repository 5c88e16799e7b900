"""The demo's replay rule (:mod:`agentdb.tools.demo.workload`) on ledgers written by hand,
its read-once rule for signals (:mod:`agentdb.tools.demo.checks`) likewise, a real run
with its approvals, fan-outs, cancels and schedules, and how a demo run ends when it is
told to.

Each replay case writes one charge's history: agentdb's side through the
library (reserve, complete, fail, mark_unknown, reconcile) and the provider's
side as rows of ``agentdb_demo.provider_requests``, in the order given, then
counts the replays the rule does not justify. The crash tests show the rule on
real crashes; these pin down its edges, which real crashes reach only by
chance.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from agentdb import leases, operations, signals, steps, tasks
from agentdb.errors import ConfigurationError
from agentdb.models import Operation
from agentdb.tools.demo.actors import REVIEWER, SCHEDULE, Plan
from agentdb.tools.demo.checks import FLOW_KEYS
from agentdb.tools.demo.fleet import Fleet, Workload
from agentdb.tools.demo.provider import REJECTED, REVIEW_ABOVE, SCHEMA, TASK_TYPE
from agentdb.tools.demo.report import report
from agentdb.tools.demo.workload import _FLOW_FAILURES, Result, _lines, count, run_workload
from tests import _pg, _procs
from tests import factories as F
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent

_LEDGER_STEPS = ("reserve", "complete", "fail", "unknown", "reconcile")


async def _play(
    pool: asyncpg.Pool, admin: asyncpg.Connection, tenant: uuid.UUID, steps: tuple[str, ...]
) -> dict[str, int]:
    for statement in SCHEMA:
        await admin.execute(statement)
    task = (await tasks.create(pool, tenant, TASK_TYPE, params={"invoice": 1, "amount": 5})).id
    key = f"{task}/charge"
    op: Operation | None = None
    for step in steps:
        if step not in _LEDGER_STEPS:
            await admin.execute(
                "INSERT INTO agentdb_demo.provider_requests (key, action, task_id, outcome)"
                " VALUES ($1, 'charge', $2, $3)",
                key,
                task,
                step,
            )
        elif step == "reserve":
            res = await operations.reserve(pool, tenant, task, key, "charge", {"amount": 5})
            assert res.fresh
            op = res.operation
        else:
            assert op is not None
            if step == "complete":
                op = await operations.complete(pool, op, provider_reference="ch_1")
            elif step == "fail":
                op = await operations.fail(pool, op, "no effect found at the provider")
            elif step == "unknown":
                op = await operations.mark_unknown(pool, op, error="provider timed out")
            else:
                op = await operations.reconcile(pool, op, succeeded=True, provider_reference="ch_1")
    return await count(admin, [tenant])


@pytest.mark.parametrize(
    ("steps", "unjustified"),
    [
        pytest.param(("reserve", "executed"), 0, id="the-first-call"),
        pytest.param(("reserve", "refused", "fail", "reserve", "executed"), 0, id="retry-a-503"),
        pytest.param(
            ("reserve", "executed", "complete", "replayed"), 1, id="blind-repeat-after-success"
        ),
        pytest.param(("reserve", "executed", "replayed"), 1, id="repeat-without-a-second-grant"),
        pytest.param(
            ("reserve", "executed", "unknown", "replayed"), 0, id="idempotent-retry-of-unknown"
        ),
        pytest.param(
            ("reserve", "executed", "unknown", "reconcile", "replayed"),
            1,
            id="repeat-after-the-unknown-was-reconciled",
        ),
        pytest.param(
            ("reserve", "executed", "fail", "reserve", "replayed"),
            0,
            id="re-armed-after-the-lookup-missed-a-call-on-its-way",
        ),
        pytest.param(
            ("reserve", "fail", "reserve", "executed", "replayed"),
            0,
            id="the-first-grants-late-call-lands-second",
        ),
        pytest.param(
            ("reserve", "executed", "fail", "reserve", "replayed", "replayed"),
            1,
            id="two-calls-on-one-re-arm",
        ),
        pytest.param(("received", "executed", "replayed"), 1, id="no-operation-at-all"),
    ],
)
async def test_a_replay_is_justified_only_by_a_grant_or_an_unknown_outcome(
    pool: asyncpg.Pool,
    admin_conn: asyncpg.Connection,
    tenants: Tenants,
    steps: tuple[str, ...],
    unjustified: int,
) -> None:
    counts = await _play(pool, admin_conn, tenants.a, steps)
    assert counts["replayed"] == steps.count("replayed")
    assert counts["unjustified_replays"] == unjustified


_BOOKS = {"overspent": 0, "budget_spent": 10, "budget_charged": 10}


def _run(**counts: int) -> Result:
    """A run that finished with these counts (every other one 0)."""
    every = {"duplicates": 0, "lost": 0, "unjustified_replays": 0, **_BOOKS}
    every.update(dict.fromkeys(FLOW_KEYS, 0))
    every.update(counts)
    return Result(True, 1.0, 1, {}, every, {"succeeded": 1}, {"delivered": 1}, Path("log"))


@pytest.mark.parametrize(("replays", "ok"), [(0, True), (1, False)])
def test_an_unjustified_replay_fails_the_run(replays: int, ok: bool) -> None:
    assert _run(unjustified_replays=replays).ok is ok


@pytest.mark.parametrize(
    ("books", "ok"),
    [
        (_BOOKS, True),
        ({**_BOOKS, "overspent": 1}, False),
        ({**_BOOKS, "budget_spent": 11}, False),
    ],
)
def test_G19_an_overspent_or_unbalanced_budget_fails_the_run(
    books: dict[str, int], ok: bool
) -> None:
    assert _run(**books).ok is ok


@pytest.mark.parametrize("failure", [*_FLOW_FAILURES, "other_stuck"])
def test_G20_G22_G23_G24_a_double_wake_a_lost_signal_or_an_effect_after_a_cancel_fails_the_run(
    failure: str,
) -> None:
    """Each of them, alone, fails a run (a stuck child or tick counts as a stuck task); the
    counts that only describe the run (approvals, cancels, ticks) do not."""
    assert _run().ok
    assert _run(approved=5, rejected=1, cancelled=2, ticks=9, in_flight_at_cancel=1).ok
    assert not _run(**{failure: 1}).ok


def test_the_line_items_add_up_to_the_invoice_and_the_plans_are_the_seeds() -> None:
    rng = random.Random(1)
    for amount in [1, 2, 3, 4, 5, *(rng.randint(1, 500) for _ in range(200))]:
        lines = _lines(rng, amount)
        assert sum(lines) == amount
        assert 1 <= len(lines) <= 4
        assert min(lines) >= 1
    assert [Plan.of("7", i) for i in range(50)] == [Plan.of("7", i) for i in range(50)]
    assert [Plan.of("7", i) for i in range(50)] != [Plan.of("8", i) for i in range(50)]


async def _handed(
    admin: asyncpg.Connection, task: uuid.UUID, tenant: uuid.UUID, seq: int, token: int
) -> None:
    """The invoice handler's note: the run with lease ``token`` was handed signal ``seq``."""
    await admin.execute(
        "INSERT INTO agentdb_demo.signal_reads (tenant_id, task_id, seq, lease_token)"
        " VALUES ($1, $2, $3, $4)",
        tenant,
        task,
        seq,
        token,
    )


@pytest.mark.parametrize(
    ("second_run_handed", "twice"),
    [
        pytest.param(1, 0, id="the-recorded-approval-again-on-re-entry"),
        pytest.param(2, 1, id="another-approval-than-the-recorded-one"),
    ],
)
async def test_G22_G25_a_run_handed_another_approval_than_its_step_took_is_counted_twice(
    pool: asyncpg.Pool,
    admin_conn: asyncpg.Connection,
    tenants: Tenants,
    second_run_handed: int,
    twice: int,
) -> None:
    """The review step takes one approval and records it (G25): every later run of the task
    is handed that one again - a replay, as it must be. A run handed another approval than
    the recorded one was a second delivery."""
    for statement in SCHEMA:
        await admin_conn.execute(statement)
    params = {"invoice": 1, "amount": REVIEW_ABOVE + 1, "lines": [REVIEW_ABOVE + 1]}
    task = await tasks.create(pool, tenants.a, TASK_TYPE, params=params)
    sent = await signals.approve(pool, tenants.a, task.id, approver=REVIEWER)
    await tasks.signal(pool, tenants.a, task.id, "approval")  # seq 2: not the one taken
    [run] = await leases.claim(pool, "w-1", lease_ttl=timedelta(seconds=30))
    assert run.lease is not None
    taken = await steps.take_signal(
        pool, tenants.a, task.id, "review", "approval", input_hash=F.HASH, lease=run.lease
    )
    assert taken.step is not None
    assert taken.step.signal is not None
    assert taken.step.signal.seq == sent.seq
    await _handed(admin_conn, task.id, tenants.a, sent.seq, run.lease_token)
    await _handed(admin_conn, task.id, tenants.a, second_run_handed, run.lease_token + 1)
    counts = await count(admin_conn, [tenants.a])
    assert counts["approvals_read"] == 1
    assert counts["signals_read_twice"] == twice
    assert counts["approvals_miscounted"] == 0


def test_G20_G22_G23_G24_a_run_reviews_fans_out_cancels_and_ticks_under_kills(
    db: Database, tmp_path: Path
) -> None:
    """A small real run, with SIGKILLs: approvals and rejections (some sent twice), line
    items priced by children, cancels, ticks - and from the database, nothing delivered,
    woken or done twice, nothing lost, nothing after a cancel. Seed 2 plans 9 large
    invoices of 30 (2 to reject, 1 review sent twice, 2 early) and 5 cancels, one for
    each state."""
    w = Workload(
        tasks=30, tenants=2, workers=2, relays=1, kill_every=0.5, seed=2, timeout=150,
        progress=False,
    )  # fmt: skip
    log_path = tmp_path / "processes.log"
    with open(log_path, "ab") as log:
        r = asyncio.run(run_workload(db.admin_dsn, w, log, log_path))
    c = r.counts
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = report(w, r)
    assert status == 0, out.getvalue()
    assert r.ok, out.getvalue()
    assert r.kills > 0
    assert {k: c[k] for k in _FLOW_FAILURES} == dict.fromkeys(_FLOW_FAILURES, 0)
    # What the plan asked for happened (the cancels may pre-empt a review or two).
    assert c["approved"] >= 3, c
    assert c["rejected"] >= 1, c
    assert c["approvals_read"] >= c["approved"] - c["cancelled"]
    assert c["reviews"] == c["approved"] + c["rejected"]
    assert c["cancels"] >= 3, c
    assert c["cancelled"] >= 2, c
    # Every invoice fans out but those cancelled or rejected before it could.
    assert c["children"] >= c["parents"] >= 30 - c["cancelled"] - c["rejected"], c
    assert c["parents_woken"] >= 1, c
    assert c["schedules"] == 2, c
    assert c["ticks"] >= 2, c
    assert r.tasks_by_state.get("failed", 0) == c["rejected_failed"] + c["budget_stopped"]
    lines = dict(
        line.strip().rsplit("  ", 1) for line in out.getvalue().splitlines() if line[:2] == "  "
    )
    report_of = {k.strip(): v.strip() for k, v in lines.items()}
    assert report_of["signals lost"] == "0"
    assert report_of["effects after a cancel"].startswith("0 ")
    assert " (0 double wakes, 0 never woken)" in report_of["parents woken by their last child"]
    with _pg.admin(db.admin_dsn) as conn:
        # A rejected invoice was never charged; and the schedules stopped with the run.
        rejected_effects = conn.execute(
            "SELECT count(*) FROM agentdb_demo.provider_effects e JOIN agent_tasks t"
            " ON t.id = e.task_id WHERE t.last_error = %s",
            (REJECTED,),
        ).fetchone()
        running = conn.execute(
            "SELECT count(*) FROM agent_schedules WHERE name = %s AND NOT paused", (SCHEDULE,)
        ).fetchone()
    assert (rejected_effects, running) == ((0,), (0,))


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: str(s.name)
)
def test_a_demo_ended_by_a_signal_mid_run_leaves_no_process(
    db: Database, sig: signal.Signals, tmp_path: Path
) -> None:
    """SIGTERM and SIGINT (to the demo alone, not its process group): the demo stops its
    workers and relays, reaps them and says so in one line, which names their logs (kept).
    SIGKILL: the kernel kills them when the demo dies (they asked it to), so that none goes
    on holding leases and connections."""
    mark = uuid.uuid4().hex
    demo = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "demo", "--dsn", db.admin_dsn, "--tasks", "300",
         "--tenants", "3", "--timeout", "200", "--seed", "5"],
        cwd=ROOT, env=_procs.marked_env(mark, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _procs.wait_for_children(demo, mark, within=120), "no worker started"
        time.sleep(1)  # mid-run: the processes are connecting and claiming
        demo.send_signal(sig)
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    if sig == signal.SIGKILL:
        assert demo.returncode == -signal.SIGKILL
        assert _procs.gone(mark, within=30) == []  # a SIGKILLed process still takes a moment
        return
    assert demo.returncode == 128 + sig, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"agentdb: demo stopped by {sig.name} after "), err
    assert "while running the workload: " in last
    (logs,) = tmp_path.glob("agentdb-run-*/processes.log")
    assert f"(worker and relay logs: {logs})" in last
    assert _procs.marked(mark) == []  # reaped before the demo exited


class _Misconfigured(Fleet):
    """A fleet whose workers cannot start: their handler does not exist."""

    def worker(self) -> subprocess.Popen[bytes]:
        return self._spawn("", "worker", "no_such_module:handler")


def test_a_process_that_cannot_start_stops_the_run_with_its_line(
    db: Database, tmp_path: Path
) -> None:
    """A worker that exits with the usage status (2) would fail the same way forever:
    the supervisor stops with its line instead of replacing it until the timeout. A
    SIGKILLed one (the demo's own kills, a fault point) is replaced (the control)."""
    one = Workload(workers=1, relays=0)
    with open(tmp_path / "processes.log", "ab") as log:
        with _Misconfigured(db.admin_dsn, one, log, tmp_path / "faults") as fleet:
            assert fleet.workers[0].wait(60) == 2
            with pytest.raises(ConfigurationError) as stopped:
                fleet.supervise()
        assert fleet.died == 0
        assert "cannot import handler module 'no_such_module'" in str(stopped.value), stopped
        with Fleet(db.admin_dsn, one, log, tmp_path / "faults") as fleet:
            first = fleet.workers[0]
            first.kill()
            first.wait(60)
            fleet.supervise()
            assert (fleet.died, fleet.workers[0] is first) == (1, False)
