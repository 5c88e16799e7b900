"""The OpenAI Agents SDK on agentdb (agentdb.integrations.openai_agents), run by the real worker
(``agentdb.testing.drain``) against Postgres with the offline model: model requests replayed
from the ledger, tool calls performed once per key, approvals, renamed steps, budgets, and
the SDK's own examples unchanged but for the runner line. The crash matrix with real worker
processes is tests/integrations/test_openai_agents_crash.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import pytest
from agents import Agent, RunConfig

from agentdb import budgets, overview, tasks
from agentdb.errors import ConfigurationError, TaskFinished
from agentdb.integrations import openai_agents as oa
from agentdb.testing import drain
from agentdb.worker import Job, Succeed
from tests.conftest import Tenants
from tests.integrations import openai_agents_handlers as h

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")


def _example(name: str) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the example's annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


@pytest.fixture
def customer_service() -> Iterator[ModuleType]:
    yield from _example("openai_agents_customer_service")


@pytest.fixture
def human_in_the_loop() -> Iterator[ModuleType]:
    yield from _example("openai_agents_human_in_the_loop")


async def _state(pool: asyncpg.Pool, tenant: uuid.UUID, task_id: uuid.UUID) -> tuple[str, Any]:
    task = await tasks.get(pool, tenant, task_id)
    payload = await pool.fetchval(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND event_type = 'task.succeeded'",
        task_id,
    )
    return task.state, json.loads(payload) if payload else task.last_error


async def _steps(pool: asyncpg.Pool, task_id: uuid.UUID) -> list[str]:
    rows = await pool.fetch(
        "SELECT name FROM agent_steps WHERE task_id = $1 ORDER BY created_at, name", task_id
    )
    return [r["name"] for r in rows]


async def _ops(pool: asyncpg.Pool, task_id: uuid.UUID) -> list[tuple[str, str, str]]:
    rows = await pool.fetch(
        "SELECT idempotency_key, action, state FROM agent_operations WHERE task_id = $1"
        " ORDER BY created_at",
        task_id,
    )
    prefix = f"{task_id}/"
    return [(r["idempotency_key"].removeprefix(prefix), r["action"], r["state"]) for r in rows]


# ---- the SDK's examples, unchanged but for the runner line ------------------------------------


async def test_the_sdks_customer_service_example_runs_on_agentdb_with_handoffs_and_tools(
    pool: asyncpg.Pool, tenants: Tenants, customer_service: ModuleType
) -> None:
    messages = ["Please change my seat to 23A, confirmation number abc123",
                "How many seats are there on the plane?"]  # fmt: skip
    task = await tasks.create(pool, tenants.a, "customer_service", params={"messages": messages})
    await drain(pool, customer_service.HANDLERS)
    state, payload = await _state(pool, tenants.a, task.id)
    assert state == "succeeded", payload
    transcript = payload["transcript"]
    assert transcript[:5] == [
        "Triage Agent: Skipping item: HandoffCallItem",
        "Handed off from Triage Agent to Seat Booking Agent",
        "Seat Booking Agent: Calling a tool",
        "Seat Booking Agent: Tool call output: Updated seat to 23A for confirmation number ABC123",
        "Seat Booking Agent: Updated seat to 23A for confirmation number ABC123",
    ]
    assert "Handed off from Triage Agent to FAQ Agent" in transcript
    assert transcript[-1].startswith("FAQ Agent: There are 120 seats on the plane.")
    # Two runs (one per message), each request a step named by its run, number and agent.
    names = await _steps(pool, task.id)
    assert [re.sub(r"#\w+$", "", n) for n in names] == [
        "agent/m1/Triage Agent", "agent/m2/Seat Booking Agent", "agent/m3/Seat Booking Agent",
        "agent.2/m1/Seat Booking Agent", "agent.2/m2/Triage Agent", "agent.2/m3/FAQ Agent",
        "agent.2/m4/FAQ Agent",
    ]  # fmt: skip
    # Both tools ran as effects, each keyed by run, agent, tool and the model's call id.
    assert [(k.split("/")[3], a, s) for k, a, s in await _ops(pool, task.id)] == [
        ("update_seat", "update_seat", "succeeded"),
        ("faq_lookup_tool", "faq_lookup_tool", "succeeded"),
    ]


async def test_the_sdks_human_in_the_loop_example_waits_for_an_agentdb_approval(
    pool: asyncpg.Pool, tenants: Tenants, human_in_the_loop: ModuleType
) -> None:
    task = await tasks.create(pool, tenants.a, "weather_assistant")
    await drain(pool, human_in_the_loop.HANDLERS)
    waiting = await tasks.get(pool, tenants.a, task.id)
    assert (waiting.state, waiting.lease) == ("waiting", None)  # no worker holds it
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    assert pending["tool"] == "get_temperature"
    assert json.loads(pending["arguments"]) == {"city": "Oakland"}
    # The console's approvals inbox shows the same ask.
    [inbox] = await overview.approvals(pool, tenants.a)
    assert inbox["id"] == str(task.id)
    assert (inbox["asked"]["tool"], inbox["asked"]["call_id"]) == (
        "get_temperature", pending["call_id"],
    )  # fmt: skip
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="alice@acme")
    await drain(pool, human_in_the_loop.HANDLERS)
    assert await _state(pool, tenants.a, task.id) == (
        "succeeded",
        {"final_output": "The weather in Oakland is sunny "
                         "The temperature in Oakland is 20° Celsius"},
    )  # fmt: skip
    assert await oa.pending_approvals(pool, tenants.a, task.id) == []


# ---- replay: the model asked once per request, each tool performed once ---------------------


async def test_a_run_re_entered_replays_its_model_requests_and_tool_calls(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    model = h.OFFLINE.model_provider.get_model(None)
    assert isinstance(model, oa.OfflineModel)
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": "R1"})
    await drain(pool, h.HANDLERS)
    asked, guarded = model.asked, len(h.GUARD_RUNS)
    assert asked == 1  # the model asked for the refund; the run waits for its approval
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="alice")
    await drain(pool, h.HANDLERS)
    state, payload = await _state(pool, tenants.a, task.id)
    assert (state, payload) == (
        "succeeded",
        {"output": "Done for R1: refund: refunded 42 EUR for R1"},
    )
    # Re-entered from the top: the first request and the guardrail replayed, one new request.
    assert model.asked == asked + 1
    assert len(h.GUARD_RUNS) == guarded
    refunds = await h.payments.effects(pool)
    assert [(c.action, c.args, c.idempotency_key) for c in refunds] == [
        ("refund", {"order": "R1", "amount": 42},
         f"{task.id}/agent/tool/Refunds/refund/{pending['call_id']}")
    ]  # fmt: skip


async def test_a_tool_gets_its_idempotency_key_and_a_read_only_tool_is_a_step(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "refund_agent", params={"order": "K1"})
    await drain(pool, h.HANDLERS)
    state, payload = await _state(pool, tenants.a, task.id)
    assert state == "succeeded", payload
    assert payload["output"] == (
        "Done for K1: email_customer: sent; lookup_order: order K1: 42 EUR, paid by card; "
        "refund: refunded 42 EUR for K1"
    )
    ops = await _ops(pool, task.id)
    assert [(k.split("/")[3], a, s) for k, a, s in ops] == [
        ("refund", "refund", "succeeded"), ("email_customer", "email_customer", "succeeded"),
    ]  # fmt: skip
    assert [c.idempotency_key for c in await h.payments.effects(pool)] == [f"{task.id}/{ops[0][0]}"]
    assert any("/tool/Refunds/lookup_order/" in n for n in await _steps(pool, task.id))


# ---- approvals ----------------------------------------------------------------------------------


async def test_an_approval_twice_performs_the_tool_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": "T2"})
    await drain(pool, h.HANDLERS)
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="alice")
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="bob")
    await drain(pool, h.HANDLERS)
    assert (await _state(pool, tenants.a, task.id))[0] == "succeeded"
    assert [c.args for c in await h.payments.effects(pool)] == [{"order": "T2", "amount": 42}]
    with pytest.raises(TaskFinished):
        await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="carol")


async def test_a_rejection_ends_the_tool_call_as_rejected_and_the_model_sees_it(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": "T3"})
    await drain(pool, h.HANDLERS)
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="alice",
                     decision="rejected")  # fmt: skip
    await drain(pool, h.HANDLERS)
    assert await _state(pool, tenants.a, task.id) == (
        "succeeded", {"output": "Done for T3: refund: Tool execution was not approved."}
    )  # fmt: skip
    assert await h.payments.effects(pool) == []
    assert await _ops(pool, task.id) == []  # nothing was reserved for it


async def test_the_worker_cannot_approve_its_own_tool_call(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """An approval is agentdb's (G22): whoever held the task's lease may not send it."""
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": "T4"})
    await drain(pool, h.HANDLERS)
    holder = await pool.fetchval(
        "SELECT actor_id FROM agent_events WHERE task_id = $1 AND event_type = 'task.claimed'",
        task.id,
    )
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    from agentdb.errors import SignalRuleViolation

    with pytest.raises(SignalRuleViolation):
        await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver=holder)


async def test_a_guardrail_tripwire_still_stops_the_run(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": "fraud"})
    await drain(pool, h.HANDLERS)
    assert await _state(pool, tenants.a, task.id) == ("failed", "the guardrail stopped it")
    assert await h.payments.effects(pool) == []


# ---- stable names (G25) ---------------------------------------------------------------------


async def _suspended(pool: asyncpg.Pool, tenants: Tenants, order: str) -> uuid.UUID:
    task = await tasks.create(pool, tenants.a, "approval_agent", params={"order": order})
    await drain(pool, h.HANDLERS)
    [pending] = await oa.pending_approvals(pool, tenants.a, task.id)
    await oa.approve(pool, tenants.a, task.id, pending["call_id"], approver="alice")
    return task.id


def _deployed(agent: Agent[Any]) -> dict[str, Any]:
    async def approval_agent(job: Job) -> Succeed:
        result = await oa.AgentdbRunner.run(agent, "Refund order N1", run_config=h.OFFLINE)
        return Succeed(payload={"output": result.final_output})

    return {"approval_agent": approval_agent}


async def test_a_renamed_agent_fails_the_run_naming_the_recorded_step(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task_id = await _suspended(pool, tenants, "N1")
    await drain(pool, _deployed(h.approval_desk(name="Refund Desk")))
    state, error = await _state(pool, tenants.a, task_id)
    assert state == "failed"
    assert re.match(
        r"StepMissing: step 'agent/m1/Refunds#\w+' of task .* was recorded for agent "
        r"'Refunds', and this run reached agent 'Refund Desk' there",
        error,
    )
    assert await h.payments.effects(pool) == []


async def test_a_removed_tool_a_recorded_response_called_fails_the_run_naming_the_step(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task_id = await _suspended(pool, tenants, "N1")
    await drain(pool, _deployed(h.approval_desk(tools=[h.email_customer])))
    state, error = await _state(pool, tenants.a, task_id)
    assert state == "failed"
    assert re.match(r"StepMissing: step 'agent/m1/Refunds#\w+' .* recorded a call to 'refund', "
                    r"which agent 'Refunds' no longer has", error)  # fmt: skip
    assert await h.payments.effects(pool) == []


async def test_a_changed_prompt_asks_the_model_again_and_an_identical_one_replays(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task_id = await _suspended(pool, tenants, "N1")
    changed = Agent(name="Refunds", instructions="Refund orders, politely.",
                    tools=[h.refund_with_approval])  # fmt: skip
    model = h.OFFLINE.model_provider.get_model(None)
    assert isinstance(model, oa.OfflineModel)
    before = model.asked
    await drain(pool, _deployed(changed))
    # The new prompt is a new request: asked again (m1 under a new fingerprint). Its answer
    # calls the refund with the call id the approval was sent for: that call runs once, and
    # the model is asked for the answer.
    assert model.asked == before + 2
    names = await _steps(pool, task_id)
    assert len([n for n in names if n.startswith("agent/m1/Refunds#")]) == 2
    assert await _state(pool, tenants.a, task_id) == (
        "succeeded", {"output": "Done for N1: refund: refunded 42 EUR for N1"}
    )  # fmt: skip
    assert len(await h.payments.effects(pool)) == 1


# ---- budgets (G19) --------------------------------------------------------------------------


async def test_model_requests_and_tool_calls_hold_and_settle_budgets(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_budget(pool, tenants.a, "tokens", 100_000)
    await budgets.set_budget(pool, tenants.a, "usd_micros", 60_000)

    async def costed(job: Job) -> Succeed:
        result = await oa.AgentdbRunner.run(
            h.refund_desk(), "Refund order B1", run_config=h.OFFLINE,
            tool_costs={"refund": {"usd_micros": 50_000}},
            model_cost=lambda request: {"tokens": 5_000},
        )  # fmt: skip
        return Succeed(payload={"output": result.final_output})

    task = await tasks.create(pool, tenants.a, "costed")
    await drain(pool, {"costed": costed})
    assert (await _state(pool, tenants.a, task.id))[0] == "succeeded"
    ops = await _ops(pool, task.id)
    assert [a for _, a, _ in ops].count("model") == 5  # each request an effect holding tokens
    by_unit = {b.unit: b for b in await budgets.list_budgets(pool, tenants.a)}
    assert by_unit["usd_micros"].spent == 50_000
    assert 0 < by_unit["tokens"].spent < 5 * 5_000  # settled with the tokens used
    assert by_unit["tokens"].held == by_unit["usd_micros"].held == 0

    # A second refund would overspend: refused at reserve, the provider never called.
    again = await tasks.create(pool, tenants.a, "costed", max_attempts=1)
    await drain(pool, {"costed": costed})
    state, error = await _state(pool, tenants.a, again.id)
    assert state == "dead"
    assert error.startswith("BudgetExceeded")
    assert len(await h.payments.effects(pool)) == 1


# ---- what it refuses --------------------------------------------------------------------------


async def test_outside_a_handler_streaming_and_sessions_are_refused() -> None:
    agent = h.refund_desk()
    with pytest.raises(ConfigurationError, match="inside an agentdb task handler"):
        await oa.AgentdbRunner.run(agent, "hi", run_config=RunConfig())
    with pytest.raises(ConfigurationError, match="does not stream"):
        oa.AgentdbRunner.run_streamed(agent, "hi")
    job: Any = object()
    with pytest.raises(ConfigurationError, match="session"):
        await oa.AgentdbRunner.run(agent, "hi", job=job, session=object())


# ---- the frameworks guide's first example ---------------------------------------------------


def test_the_guide_shows_the_first_example_as_the_file_is_in_30_lines() -> None:
    guide = (ROOT / "docs" / "guides" / "frameworks.md").read_text()
    section = guide[guide.index("## OpenAI Agents SDK") :]
    first = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert first is not None
    example = (ROOT / "examples" / "openai_agents_first_agent.py").read_text()
    assert first.group(1) == example
    assert len(example.splitlines()) <= 30


def test_the_guide_s_first_example_runs_as_written() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_agents_first_agent.py")],
        capture_output=True, text=True, timeout=240, check=False, cwd=ROOT,
        env=dict(os.environ, OPENAI_AGENTS_DISABLE_TRACING="1"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"support succeeded attempts=1", out.stdout), out.stdout + out.stderr
