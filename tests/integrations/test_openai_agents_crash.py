"""An OpenAI Agents SDK agent run by real ``agentdb worker`` processes, SIGKILLed: at each fault
point in turn (the testing kit's crash matrix: mid model request, mid tool call, between a
tool call and its record, ...) and at random moments, restarted until it finishes.

Each tool's fake provider (:class:`~agentdb.testing.RecordingProvider`) must have performed
each call once per key, the model must have been asked again only for a request whose
outcome the kill left unknown (one that was in flight), the final output must be the
uncrashed run's and no run may be left unfinished. The control - the same agent on the
SDK's own ``Runner.run``, killed the same way - performs a tool call twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from agentdb import _db, tasks
from agentdb.testing import crash_test
from agentdb.testing.provider import DSN_ENV, SCENARIO_ENV, install
from agentdb.tools._process import stop
from agentdb.tools.demo.fleet import kills_by_point, spawn_cli
from tests.conftest import Database, Tenants
from tests.integrations import openai_agents_handlers as h

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.integrations.openai_agents_handlers:HANDLERS"


@pytest.fixture(autouse=True)
def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")


def _expected(order: str) -> dict[str, str]:
    return {
        "output": f"Done for {order}: email_customer: sent; lookup_order: order {order}: 42 EUR, "
        f"paid by card; refund: refunded 42 EUR for {order}"
    }


async def _outputs(admin: asyncpg.Connection) -> dict[str, list[object]]:
    rows = await admin.fetch(
        "SELECT t.name, e.payload FROM agent_events e JOIN agent_tenants t ON t.id = e.tenant_id"
        " WHERE e.event_type = 'task.succeeded' ORDER BY t.name"
    )
    found: dict[str, list[object]] = {}
    for r in rows:
        found.setdefault(r["name"], []).append(json.loads(r["payload"]))
    return found


async def test_an_agent_killed_at_every_point_calls_each_tool_once_and_re_asks_only_the_unknown(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    report = await crash_test(
        db, h.HANDLERS, [("refund_agent", {"order": "C1"})], [h.payments, h.mail, h.model_log],
        check=False, within=120,
    )  # fmt: skip
    base = report.baseline
    assert base.task_states == ("succeeded",)
    tools = Counter((p, c.action, json.dumps(c.args, sort_keys=True)) for p, c in base.calls
                    if p != "model" and c.outcome == "executed")  # fmt: skip
    assert sorted(tools) == [
        (
            "mail",
            "email",
            json.dumps({"order": "C1", "text": "Your refund is on its way"}, sort_keys=True),
        ),
        ("payments", "refund", json.dumps({"order": "C1", "amount": 42}, sort_keys=True)),
    ]
    asked = Counter(c.args["step"] for p, c in base.calls if p == "model")
    first_request = next(c.args["step"] for p, c in base.calls if p == "model")
    assert len(asked) == 5  # m1..m5
    assert set(asked.values()) == {1}  # each asked once
    points = {s.point for s in report.scenarios}
    # Mid model request (during_step), mid tool call (during_effect: the function runs;
    # during_call: the provider has the request), between the call and its record
    # (after_call), and every worker point around them.
    assert {"during_step", "during_effect", "during_call", "after_call", "after_complete",
            "after_reserve", "before_group_commit", "after_transition"} <= points  # fmt: skip
    for s in report.scenarios:
        assert s.killed, s.point
        assert s.task_states == ("succeeded",), s.describe()  # none stuck
        executed = Counter((p, c.action, json.dumps(c.args, sort_keys=True)) for p, c in s.calls
                           if p != "model" and c.outcome == "executed")  # fmt: skip
        assert executed == tools, s.describe()  # each tool call performed once
        keys = [c.idempotency_key for p, c in s.calls if p != "model"]
        assert None not in keys, s.describe()  # never called without its key
        again = Counter(c.args["step"] for p, c in s.calls if p == "model")
        # The model is asked again only for the request the kill left in flight (killed at
        # during_step: the first request, which may or may not have reached it), and no
        # request is lost.
        assert asked - again == Counter(), s.describe()
        in_flight = (
            [Counter(), Counter({first_request: 1})] if s.point == "during_step" else [Counter()]
        )
        assert again - asked in in_flight, s.describe()
        blind = [p for p in s.problems if "Reservation.fresh" in p]
        assert blind == [], s.describe()
    # The final output of every run is the uncrashed run's.
    outputs = await _outputs(admin_conn)
    assert len(outputs) == len(report.scenarios) + 1
    assert all(o == [_expected("C1")] for o in outputs.values()), outputs


async def test_the_control_on_the_sdks_own_runner_performs_a_tool_call_twice(
    db: Database,
) -> None:
    report = await crash_test(
        db, h.HANDLERS, [("refund_agent_plain", {"order": "C2"})], [h.payments, h.mail],
        check=False, within=120,
    )  # fmt: skip
    assert report.baseline.ok
    killed_after_the_calls = next(s for s in report.scenarios if s.point == "before_group_commit")
    assert not killed_after_the_calls.ok
    assert (
        'payments: refund({"amount":42,"order":"C2"}) was performed 2 time(s) when the worker was'
        " killed at before_group_commit, 1 without a crash: the step is not idempotent"
    ) in killed_after_the_calls.problems
    # And without a key the provider cannot tell the repeat from a new refund.
    assert {c.idempotency_key for _, c in killed_after_the_calls.calls} == {None}


async def test_agents_killed_at_random_moments_finish_as_if_never_killed(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Workers armed to SIGKILL themselves at random (mid model request, mid tool call, after
    the call before its record, after the record), restarted each time until every run is
    done; then the providers' and the model's logs are read."""
    orders = [f"S{i}" for i in range(4)]
    ids = []
    for order in orders:
        t = await tasks.create(pool, tenants.a, "refund_agent", params={"order": order},
                               lease_ttl=timedelta(seconds=1), max_attempts=200)  # fmt: skip
        ids.append(t.id)
    admin = await _db.create_pool(db.admin_dsn, min_size=1, max_size=2)
    await install(admin)
    await admin.close()
    faults = ",".join(f"{p}=0.12" for p in ("during_step", "during_effect", "during_call",
                                              "after_call", "after_complete"))  # fmt: skip
    env = dict(os.environ, DATABASE_URL=db.admin_dsn, PYTHONPATH=str(ROOT))
    env.update({DSN_ENV: db.admin_dsn, SCENARIO_ENV: "soak",
                "AGENTDB_FAULTS_LOG": str(tmp_path / "kills")})  # fmt: skip
    argv = ["worker", TARGET, "--dsn", db.admin_dsn, "--concurrency", "2", "--poll-interval",
            "0.05", "--retry-base", "0.01", "--shutdown-grace", "1",
            "--log-level", "warning"]  # fmt: skip

    async def finished() -> bool:
        states = [(await tasks.get(pool, tenants.a, i)).state for i in ids]
        return all(s == "succeeded" for s in states)

    with open(tmp_path / "workers.log", "ab") as log:  # noqa: ASYNC230
        restarts = 0
        while not await finished() and restarts < 40:
            proc = spawn_cli(argv, dict(env, AGENTDB_FAULTS=faults), log)
            try:
                while proc.poll() is None and not await finished():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            finally:
                stop(proc)
            restarts += 1
        calm: subprocess.Popen[bytes] = spawn_cli(argv, dict(env, AGENTDB_FAULTS=""), log)
        try:
            deadline = time.monotonic() + 120
            while not await finished() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            stop(calm)
    kills = kills_by_point(tmp_path / "kills")
    assert sum(kills.values()) >= 1, "no worker was killed"
    assert await finished(), (tmp_path / "workers.log").read_text()[-3000:]  # 0 stuck
    # Each tool call performed once per key, every call with its key.
    for provider, n in ((h.payments, len(orders)), (h.mail, len(orders))):
        calls = await provider.calls(pool, "soak")
        assert None not in {c.idempotency_key for c in calls}
        done = Counter(c.idempotency_key for c in calls if c.outcome == "executed")
        assert len(done) == n, (kills, calls)
        assert set(done.values()) == {1}, (kills, calls)
    # The model was never asked a request again once its response was recorded.
    late = await admin_conn.fetch(
        "SELECT c.args->>'step' AS step FROM agentdb_testing.provider_calls c"
        " JOIN agent_steps s ON s.name = c.args->>'step'"
        " WHERE c.provider = 'model' AND c.scenario = 'soak' AND c.at > s.created_at"
    )
    assert late == [], (kills, late)
    asked = await admin_conn.fetchval(
        "SELECT count(*) FROM agentdb_testing.provider_calls"
        " WHERE provider = 'model' AND scenario = 'soak'"
    )
    assert asked >= 5 * len(orders)
    # And each run's output is the uncrashed one's.
    for order, task_id in zip(orders, ids, strict=True):
        payload = await admin_conn.fetchval(
            "SELECT payload FROM agent_events WHERE task_id = $1 AND event_type = 'task.succeeded'",
            task_id,
        )
        assert json.loads(payload) == _expected(order)
