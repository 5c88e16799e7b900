"""The demo's replay rule (:mod:`agentdb.tools.demo.workload`) on ledgers written by hand,
and how a demo run ends when it is told to.

Each replay case writes one charge's history: agentdb's side through the
library (reserve, complete, fail, mark_unknown, reconcile) and the provider's
side as rows of ``agentdb_demo.provider_requests``, in the order given, then
counts the replays the rule does not justify. The crash tests show the rule on
real crashes; these pin down its edges, which real crashes reach only by
chance.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from agentdb import operations, tasks
from agentdb.errors import ConfigurationError
from agentdb.models import Operation
from agentdb.tools.demo.fleet import Fleet, Workload
from agentdb.tools.demo.provider import SCHEMA, TASK_TYPE
from agentdb.tools.demo.workload import Result, count
from tests import _procs
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


@pytest.mark.parametrize(("replays", "ok"), [(0, True), (1, False)])
def test_an_unjustified_replay_fails_the_run(replays: int, ok: bool) -> None:
    counts = {"duplicates": 0, "lost": 0, "unjustified_replays": replays, **_BOOKS}
    run = Result(True, 1.0, 1, {}, counts, {"succeeded": 1}, {"delivered": 1}, Path("log"))
    assert run.ok is ok


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
    counts = {"duplicates": 0, "lost": 0, "unjustified_replays": 0, **books}
    run = Result(True, 1.0, 1, {}, counts, {"succeeded": 1}, {"delivered": 1}, Path("log"))
    assert run.ok is ok


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: str(s.name)
)
def test_a_demo_ended_by_a_signal_mid_run_leaves_no_process(
    db: Database, sig: signal.Signals
) -> None:
    """SIGTERM and SIGINT (to the demo alone, not its process group): the demo stops its
    workers and relays, reaps them and says so in one line. SIGKILL: the kernel kills them
    when the demo dies (they asked it to), so that none goes on holding leases and connections."""
    mark = uuid.uuid4().hex
    demo = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "demo", "--dsn", db.admin_dsn, "--tasks", "300",
         "--tenants", "3", "--timeout", "200", "--seed", "5"],
        cwd=ROOT, env=_procs.marked_env(mark), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
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
