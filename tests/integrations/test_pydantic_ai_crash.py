"""A Pydantic AI agent run by real ``agentdb worker`` processes, SIGKILLed at every point it
passes (mid model request, mid tool call, between a tool call and its record): each tool's
provider performs each call once, the model is asked again only for a request whose
response was never recorded, and the output is the uncrashed run's (G13, G25).

The control: the same agent on Pydantic AI's own runner (no durability capability), killed
the same way, performs a tool's effect twice.
"""

from __future__ import annotations

import json
from collections import Counter

from agentdb.testing import crash_test
from tests.conftest import Database
from tests.integrations import pai_handlers as pai

# What each task's run answered (the task.succeeded event's payload).
_OUTPUTS = """
SELECT t.params->>'order' AS o, e.payload FROM agent_tasks t
JOIN agent_events e ON e.tenant_id = t.tenant_id AND e.task_id = t.id
WHERE t.task_type = 'pai-support' AND e.event_type = 'task.succeeded'
"""
WORK = [("pai-support", {"order": 7}), ("pai-support", {"order": 8})]


async def test_G13_G25_an_agent_killed_anywhere_calls_each_tool_once_and_ends_as_uncrashed(
    db: Database,
) -> None:
    conn = await db.connect()
    try:
        await conn.execute(pai.CALLS_TABLE)
        report = await crash_test(
            db, "tests.integrations.pai_handlers:HANDLERS", WORK, [pai.psp, pai.mailer]
        )
        assert report.ok, "\n".join(s.describe() for s in report.scenarios if not s.ok)
        points = {s.point for s in report.scenarios if s.killed}
        # Inside a model request (a step), inside a tool call (an effect), inside the
        # provider's call, and between the provider's answer and its record.
        assert {"during_step", "during_effect", "during_call", "after_call"} <= points, points
        for s in (report.baseline, *report.scenarios):
            executed = Counter(f"{p}:{c.action}" for p, c in s.calls if c.outcome == "executed")
            assert executed == {"psp:refund": 2, "mailer:email": 2}, s.describe()

        calls = {
            r["scenario"]: r["n"]
            for r in await conn.fetch(
                "SELECT scenario, count(*) AS n FROM public.pai_model_calls GROUP BY scenario"
            )
        }
        baseline = calls.pop(next(k for k in calls if k.endswith("baseline")))
        assert baseline == 3 * len(WORK)  # look up; refund and e-mail; answer
        for scenario, n in calls.items():
            # Asked again only where the worker died while the model answered (its
            # response never recorded): one request, once.
            if scenario.endswith("during_step"):
                assert baseline <= n <= baseline + 1, (scenario, n)
            else:
                assert n == baseline, (scenario, n)

        # The read-only lookup is a step, never an operation; the two tools effects.
        actions = await conn.fetch("SELECT DISTINCT action FROM agent_operations")
        assert sorted(r["action"] for r in actions) == ["refund", "send_email"]
        assert await conn.fetchval(
            "SELECT count(*) FROM agent_steps WHERE name LIKE '%call_tool:lookup_order'"
        ) == len(WORK) * (1 + len(report.scenarios))

        outputs = await conn.fetch(_OUTPUTS)
        by_order: dict[str, set[str]] = {}
        for r in outputs:
            by_order.setdefault(r["o"], set()).add(json.loads(r["payload"])["output"])
        assert len(outputs) == len(WORK) * (1 + len(report.scenarios))
        assert all(len(seen) == 1 for seen in by_order.values()), by_order
        assert by_order["7"] == {"refunded 120 on order 7; mailed ada@example.com"}
    finally:
        await conn.close()


async def test_the_control_the_same_agent_on_its_own_runner_performs_an_effect_twice(
    db: Database,
) -> None:
    conn = await db.connect()
    try:
        await conn.execute(pai.CALLS_TABLE)
    finally:
        await conn.close()
    report = await crash_test(
        db,
        "tests.integrations.pai_handlers:PLAIN",
        [("pai-plain", {"order": 7})],
        [pai.psp, pai.mailer],
        points=["after_call"],
        check=False,
    )
    [killed] = report.scenarios
    assert killed.killed
    assert not killed.ok
    executed = Counter(f"{p}:{c.action}" for p, c in killed.calls if c.outcome == "executed")
    assert executed["psp:refund"] == 2, killed.describe()  # the refund, performed twice
