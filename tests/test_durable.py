"""Straight-line durable handlers (G25): named steps, effects and waits recorded on the ledger.

Each test runs real handlers through the real worker (``agentdb.testing.drain``)
against Postgres, re-entering them from the top as the worker does after a
wait; the providers are fakes that count their calls and honour idempotency
keys, so "called once" is checked where the effect lands. The raw-SQL attacks
on ``agent_steps`` are in tests/test_attacks.py; the crash matrix over a
straight-line handler is in tests/test_durable_crash.py.
"""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from agentdb import Message, leases, operations, outbox, signals, steps, tasks
from agentdb.errors import (
    Cancelled,
    ConfigurationError,
    LeaseLost,
    PayloadTooLarge,
    StepConflict,
    TaskFinished,
)
from agentdb.models import Operation
from agentdb.testing import drain
from agentdb.worker import (
    MANUAL,
    Fail,
    Job,
    NotPerformed,
    Performed,
    Reconciled,
    Succeed,
    Suspended,
    Wait,
    Worker,
)
from agentdb.worker.durable import running_job
from tests import factories as F
from tests.conftest import Database, Tenants
from tests.test_children import _Calls, _reached, _waits_for_a_lock


class Provider:
    """A fake provider that performs each idempotency key once and counts every request."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.effects: dict[str, dict[str, Any]] = {}
        self.fail_next: list[BaseException] = []

    async def call(self, *args: Any, idempotency_key: str) -> dict[str, Any]:
        self.requests[idempotency_key] += 1
        if self.fail_next and not isinstance(self.fail_next[0], TimeoutError):
            raise self.fail_next.pop(0)
        done = self.effects.setdefault(
            idempotency_key, {"ref": f"ref-{len(self.effects) + 1}", "args": list(args)}
        )
        if self.fail_next:  # the effect happened; the answer is lost
            raise self.fail_next.pop(0)
        return done

    async def lookup(self, op: Operation) -> Reconciled | None:
        found = self.effects.get(op.idempotency_key)
        return None if found is None else Reconciled(True, found["ref"], found)


#: A sleep just long enough that the handler suspends and is re-entered from the top.
PAUSE = timedelta(milliseconds=50)


async def _run(pool: asyncpg.Pool, handlers: Any, **kw: Any) -> Any:
    # `within` only guards against a hang: drain returns as soon as no work is left. 30 s
    # was too tight a guard on a loaded 2-core box (a fan-out test here failed once so,
    # under three mutation runs at once).
    return await drain(pool, handlers, within=120, **kw)


# ---- steps -------------------------------------------------------------------------------


async def test_G25_a_step_runs_once_and_a_re_entry_replays_its_result(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    runs: list[str] = []

    async def model(prompt: str) -> dict[str, Any]:
        runs.append(prompt)
        return {"answer": prompt.upper(), "pair": (1, 2)}

    seen: list[Any] = []

    async def agent(job: Job) -> Succeed:
        answer = await job.step("plan", model, "hello")
        seen.append(answer)
        await job.sleep("pause", PAUSE)  # re-entered from the top after this
        seen.append(await job.step("plan", model, "hello"))  # the same name, replayed
        return Succeed(payload=answer)

    task = await tasks.create(pool, tenants.a, "d-step")
    done = await _run(pool, {"d-step": agent})
    assert done.count("succeeded") == 1
    assert runs == ["hello"]  # one call, however often the handler ran
    # The first run saw what every replay sees: the stored JSON (a tuple is a list).
    assert seen[0] == {"answer": "HELLO", "pair": [1, 2]}
    assert all(s == seen[0] for s in seen)
    [recorded] = [s for n, s in (await steps.ledger(pool, tenants.a, task.id)).steps.items()
                  if n == "plan"]  # fmt: skip
    assert (recorded.kind, recorded.state, recorded.result) == ("step", "done", seen[0])


async def test_G25_steps_are_keyed_by_name_so_a_skipped_one_shifts_nothing(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    def compute(what: str) -> str:
        calls[what] += 1
        return f"{what}:{calls[what]}"

    results: list[tuple[str | None, str]] = []

    async def agent(job: Job) -> Succeed:
        first_run = not (await job.ledger()).steps
        a = await job.step("a", compute, "a") if first_run else None  # skipped on a re-entry
        b = await job.step("b", compute, "b")
        results.append((a, b))
        await job.sleep("pause", PAUSE)
        return Succeed()

    await tasks.create(pool, tenants.a, "d-skip")
    assert (await _run(pool, {"d-skip": agent})).count("succeeded") == 1
    # Positionally, the re-entry's first step would have been handed "a:1" for "b".
    assert results == [("a:1", "b:1"), (None, "b:1")]
    assert calls == {"a": 1, "b": 1}


async def test_G25_a_name_reached_with_other_arguments_is_a_conflict_never_a_replay(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    async def agent(job: Job) -> Succeed:
        first = not (await job.ledger()).steps
        await job.step("plan", lambda p: {"p": p}, "v1" if first else "v2")
        await job.sleep("pause", PAUSE)
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-conflict")
    done = await _run(pool, {"d-conflict": agent})
    [t] = done.tasks
    # IdempotencyConflict's rule: another attempt would only conflict again - failed.
    assert t.state == "failed"
    assert t.last_error is not None
    assert "StepConflict" in t.last_error
    assert "'plan'" in t.last_error
    ledger = await steps.ledger(pool, tenants.a, task.id)
    assert ledger.steps["plan"].result == {"p": "v1"}  # unchanged

    # The error names both calls' hashes.
    held = await _claimed(pool, tenants.a, "d-conflict-2")
    job = Job(pool, held, reconcilers={})
    await job.step("x", lambda: 1)
    job._ledger = None  # a re-entry reads the ledger again
    with pytest.raises(StepConflict) as conflict:
        await job.step("x", lambda n: n, 2)
    assert conflict.value.step == "x"
    assert conflict.value.stored_hash != conflict.value.given_hash


async def _claimed(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str, **create: Any) -> Any:
    task = await tasks.create(pool, tenant, task_type, **create)
    [held] = await leases.claim(pool, "test-worker", task_types=[task_type])
    assert held.id == task.id
    return held


async def test_G25_a_step_result_is_checked_at_the_step_and_its_secrets_masked(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    held = await _claimed(pool, tenants.a, "d-cap")
    job = Job(pool, held, reconcilers={})
    with pytest.raises(PayloadTooLarge, match="'big'"):
        await job.step("big", lambda: "x" * 70_000)
    with pytest.raises(ConfigurationError, match="'odd'"):
        await job.step("odd", lambda: object())
    with pytest.raises(ConfigurationError, match="hashed"):
        await job.step("arg", lambda o: o, object())
    masked = await job.step("login", lambda: {"user": "bob", "password": "hunter2"})
    assert masked == {"user": "bob", "password": "[redacted]"}
    long = await job.step("long", lambda: "y" * 20_000)  # kept whole: a replay needs it
    assert long == "y" * 20_000
    ledger = await steps.ledger(pool, tenants.a, held.id)
    assert set(ledger.steps) == {"login", "long"}


async def test_G25_a_step_under_a_lost_lease_records_nothing(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    held = await _claimed(pool, tenants.a, "d-lost")
    job = Job(pool, held, reconcilers={})
    await tasks.cancel(pool, tenants.a, held.id, reason="stop")
    ran: list[int] = []

    def work() -> int:
        ran.append(1)
        return 1

    with pytest.raises(LeaseLost):  # Cancelled: the step's record is refused
        await job.step("after-cancel", work)
    assert ran == [1]  # it ran (a step may), and nothing of it was recorded
    assert (await steps.ledger(pool, tenants.a, held.id)).steps == {}


# ---- effects -----------------------------------------------------------------------------


async def test_G25_an_effect_is_reserved_before_the_call_gets_its_key_and_replays(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    states: list[str] = []

    async def charge(amount: int, *, idempotency_key: str) -> Performed:
        op = await pool.fetchrow(
            "SELECT state FROM agent_operations WHERE idempotency_key = $1", idempotency_key
        )
        states.append(op["state"] if op else "none")  # committed before the call (G13)
        done = await psp.call(amount, idempotency_key=idempotency_key)
        return Performed(done, reference=done["ref"])

    async def agent(job: Job) -> Succeed:
        paid = await job.effect("charge", charge, 500)
        await job.sleep("pause", PAUSE)
        again = await job.effect("charge", charge, 500)  # replayed, not called
        assert again == paid
        return Succeed(payload={"ref": paid["ref"]})

    task = await tasks.create(pool, tenants.a, "d-effect")
    assert (await _run(pool, {"d-effect": agent})).count("succeeded") == 1
    key = f"{task.id}/charge"
    assert psp.requests == {key: 1}
    assert states == ["reserved"]
    op = await pool.fetchrow(
        "SELECT state, action, provider_reference, result FROM agent_operations"
        " WHERE idempotency_key = $1",
        key,
    )
    assert op is not None
    assert (op["state"], op["action"], op["provider_reference"]) == ("succeeded", "charge", "ref-1")


async def test_G25_a_definite_failure_is_recorded_failed_and_the_provider_called_again(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    psp.fail_next = [NotPerformed("503: nothing done")]

    async def agent(job: Job) -> Succeed:
        await job.effect("charge", psp.call, 7)
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-definite")
    assert (await _run(pool, {"d-definite": agent})).count("succeeded") == 1
    assert psp.requests == {f"{task.id}/charge": 2}
    assert await _op_events(pool, task.id) == [
        "operation.reserved", "operation.failed", "operation.retried", "operation.succeeded",
    ]  # fmt: skip


async def _op_events(pool: asyncpg.Pool, task_id: uuid.UUID) -> list[str]:
    rows = await pool.fetch(
        "SELECT event_type FROM agent_events WHERE task_id = $1 AND operation_id IS NOT NULL"
        " ORDER BY id",
        task_id,
    )
    return [r["event_type"] for r in rows]


async def test_G25_an_unknown_outcome_without_a_hook_is_called_again_with_the_same_key(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    psp.fail_next = [TimeoutError("the answer never came")]  # performed, answer lost

    async def agent(job: Job) -> Succeed:
        paid = await job.effect("charge", psp.call, 7)
        return Succeed(payload={"ref": paid["ref"]})

    task = await tasks.create(pool, tenants.a, "d-unknown")
    done = await _run(pool, {"d-unknown": agent})
    assert done.count("succeeded") == 1
    key = f"{task.id}/charge"
    assert psp.requests == {key: 2}  # called again, with the same key
    assert len(psp.effects) == 1  # which the provider answered from its key
    assert await _op_events(pool, task.id) == [
        "operation.reserved", "operation.unknown", "operation.started", "operation.succeeded",
    ]  # fmt: skip


async def test_G25_an_unknown_outcome_with_a_hook_asks_it_instead(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    psp.fail_next = [TimeoutError("lost")]

    async def agent(job: Job) -> Succeed:
        paid = await job.effect("charge", psp.call, 7, reconcile=psp.lookup)
        return Succeed(payload={"ref": paid["ref"]})

    task = await tasks.create(pool, tenants.a, "d-hook")
    done = await _run(pool, {"d-hook": agent})
    assert done.count("succeeded") == 1
    assert psp.requests == {f"{task.id}/charge": 1}  # asked, not called again
    assert (await _op_events(pool, task.id))[-1] == "operation.reconciled"
    assert done.tasks[0].state == "succeeded"


async def test_G25_a_manual_effect_is_parked_for_an_operator_and_resumes_when_settled(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    psp.fail_next = [TimeoutError("lost")]
    results: list[Any] = []

    async def agent(job: Job) -> Succeed:
        results.append(await job.effect("wire", psp.call, 7, reconcile=MANUAL))
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-manual", max_attempts=2)
    worker = Worker(pool, {"d-manual": agent}, park_interval=0.2, poll_interval=0.05,
                    retry_base=0.01)  # fmt: skip
    running = asyncio.create_task(worker.run(install_signals=False))
    try:
        for _ in range(200):
            parked = await pool.fetchval(
                "SELECT count(*) FROM agent_events WHERE task_id = $1"
                " AND event_type = 'task.parked'",
                task.id,
            )
            if parked >= 3:
                break
            await asyncio.sleep(0.05)
        assert parked >= 3  # parked again and again, never dead of it
        now = await tasks.get(pool, tenants.a, task.id)
        assert now.state in ("pending", "running")
        assert now.attempts <= 1
        assert psp.requests == {f"{task.id}/wire": 1}  # never called blindly again
        [op] = await operations.list_unsettled(pool)
        await operations.reconcile(pool, op, succeeded=True, provider_reference="wire-9",
                                   result={"ref": "wire-9"})  # fmt: skip
        for _ in range(200):
            if (await tasks.get(pool, tenants.a, task.id)).state == "succeeded":
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await running
    assert (await tasks.get(pool, tenants.a, task.id)).state == "succeeded"
    assert results == [{"ref": "wire-9"}]
    assert worker.stats.parked >= 3


async def test_G25_an_effect_reused_with_other_arguments_is_a_step_conflict(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    held = await _claimed(pool, tenants.a, "d-effect-conflict")
    job = Job(pool, held, reconcilers={})
    await job.effect("charge", psp.call, 5)
    with pytest.raises(StepConflict, match="'charge'"):
        await job.effect("charge", psp.call, 6)
    job._ledger = None
    with pytest.raises(StepConflict):
        await job.effect("charge", psp.call, 6)
    assert sum(psp.requests.values()) == 1


# ---- waits -------------------------------------------------------------------------------


async def test_G25_a_wait_takes_one_signal_once_and_a_re_entry_gets_the_same_one(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    got: list[tuple[str, str, int]] = []

    async def agent(job: Job) -> Succeed:
        first = await job.wait_for_signal("review-1", "approval")
        second = await job.wait_for_signal("review-2", "approval")
        got.append((first.sender, second.sender, first.seq))
        await job.sleep("pause", PAUSE)
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-wait")
    await _run(pool, {"d-wait": agent})
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"
    await signals.approve(pool, tenants.a, task.id, approver="alice", comment="ok")
    await tasks.signal(pool, tenants.a, task.id, "note", {"n": 1})  # another name: not taken
    await _run(pool, {"d-wait": agent})
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"  # for the second
    await signals.approve(pool, tenants.a, task.id, approver="bob")
    done = await _run(pool, {"d-wait": agent})
    assert done.count("succeeded") == 1
    assert got == [("alice", "bob", 1), ("alice", "bob", 1)]  # the re-entry: the same two
    taken = await pool.fetch(
        "SELECT name, signal_seq FROM agent_steps WHERE task_id = $1 AND kind = 'signal'"
        " ORDER BY signal_seq",
        task.id,
    )
    assert [(r["name"], r["signal_seq"]) for r in taken] == [("review-1", 1), ("review-2", 3)]


async def test_G25_a_wait_times_out_once_and_stays_timed_out(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    held = await _claimed(pool, tenants.a, "d-timeout")
    job = Job(pool, held, reconcilers={})
    with pytest.raises(Suspended) as slept:  # nothing there: it sleeps until the timeout
        await job.wait_for_signal("ok", "approval", timeout=timedelta(hours=1))
    assert slept.value.wait.signal == "approval"
    assert slept.value.wait.until is not None
    timed_out = await _claimed(pool, tenants.a, "d-timeout-0")
    job = Job(pool, timed_out, reconcilers={})
    assert await job.wait_for_signal("ok", "approval", timeout=timedelta(0)) is None
    # An approval that comes after the time-out does not change what was recorded.
    await signals.approve(pool, tenants.a, timed_out.id, approver="late")
    again = Job(pool, timed_out, reconcilers={})
    assert await again.wait_for_signal("ok", "approval", timeout=timedelta(0)) is None
    with pytest.raises(StepConflict):  # another timeout is another wait
        await again.wait_for_signal("ok", "approval", timeout=timedelta(seconds=1))


async def test_G25_a_sleep_ends_once(pool: asyncpg.Pool, tenants: Tenants) -> None:
    runs: list[int] = []

    async def agent(job: Job) -> Succeed:
        runs.append(1)
        await job.sleep("nap", timedelta(seconds=0.2))
        await job.sleep("nap", timedelta(seconds=0.2))  # ended: returns at once
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-sleep")
    done = await _run(pool, {"d-sleep": agent})
    assert done.count("succeeded") == 1
    assert len(runs) == 2  # the first run, and the one after the sleep
    [nap] = (await steps.ledger(pool, tenants.a, task.id)).steps.values()
    assert (nap.kind, nap.state, nap.due) == ("sleep", "waiting", True)  # its end is past
    # A run that waits gives its attempt back: the two runs cost none.
    assert (await tasks.get(pool, tenants.a, task.id)).attempts == 1


async def test_G25_children_run_once_and_their_results_are_recorded(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    totals: list[int] = []

    async def parent(job: Job) -> Succeed:
        kids = await job.run_children(
            "lines", [("d-line", {"n": 1}), ("d-line", {"n": 2}), ("d-line", {"n": 3})]
        )
        totals.append(sum(k.result["n"] for k in kids if k.result))
        return Succeed(payload={"total": totals[-1]})

    async def line(job: Job) -> Succeed:
        return Succeed(payload=job.task.params)

    task = await tasks.create(pool, tenants.a, "d-parent")
    done = await _run(pool, {"d-parent": parent, "d-line": line})
    assert done.count("succeeded") == 4
    assert totals == [6]
    kids = await pool.fetch(
        "SELECT child_key FROM agent_tasks WHERE parent_id = $1 ORDER BY child_key", task.id
    )
    assert [k["child_key"] for k in kids] == ["lines/0", "lines/1", "lines/2"]
    woken = await pool.fetchval(
        "SELECT count(*) FROM agent_events WHERE task_id = $1"
        " AND event_type = 'task.children_done'",
        task.id,
    )
    assert woken == 1


async def test_G25_a_quorum_returns_the_results_it_saw_and_keeps_them(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    seen: list[list[str]] = []

    async def parent(job: Job) -> Succeed:
        kids = await job.run_children("probe", [("d-fast", None), ("d-slow", None)], quorum=1)
        seen.append([k.state for k in kids])
        await job.sleep("pause", PAUSE)
        return Succeed()

    async def fast(job: Job) -> Succeed:
        return Succeed(payload={"who": "fast"})

    task = await tasks.create(pool, tenants.a, "d-quorum")
    await _run(pool, {"d-quorum": parent, "d-fast": fast})
    assert (await tasks.get(pool, tenants.a, task.id)).state == "succeeded"
    # The slow child never ran: the quorum of one was the fast one, on both runs.
    assert seen == [["succeeded", "pending"], ["succeeded", "pending"]]


async def test_G25_a_child_that_fails_is_in_the_results_not_lost(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    got: list[list[tuple[str, bool]]] = []

    async def parent(job: Job) -> Succeed:
        kids = await job.run_children("k", [("d-ok", None), ("d-bad", None)])
        got.append([(k.state, k.succeeded) for k in kids])
        return Succeed()

    async def ok(job: Job) -> Succeed:
        return Succeed()

    async def bad(job: Job) -> Fail:
        return Fail("no")

    await tasks.create(pool, tenants.a, "d-failing")
    await _run(pool, {"d-failing": parent, "d-ok": ok, "d-bad": bad})
    assert got == [[("succeeded", True), ("failed", False)]]


# ---- composition: the README's traps ------------------------------------------------------


async def test_G25_approval_then_children_then_an_effect_composes_in_any_order(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()

    async def approve_first(job: Job) -> Succeed | Fail:
        review = await job.wait_for_signal("review", "approval")
        if review.decision != "approved":
            return Fail("rejected")
        kids = await job.run_children("lines", [("d-l", {"n": 2}), ("d-l", {"n": 3})])
        paid = await job.effect("charge", psp.call, sum(k.result["n"] for k in kids if k.result))
        return Succeed(payload={"ref": paid["ref"]})

    async def children_first(job: Job) -> Succeed | Fail:
        kids = await job.run_children("lines", [("d-l", {"n": 2}), ("d-l", {"n": 3})])
        paid = await job.effect("charge", psp.call, sum(k.result["n"] for k in kids if k.result))
        review = await job.wait_for_signal("review", "approval")
        return Succeed(payload={"ref": paid["ref"], "by": review.sender})

    async def line(job: Job) -> Succeed:
        return Succeed(payload=job.task.params)

    handlers = {"d-a": approve_first, "d-c": children_first, "d-l": line}
    a = await tasks.create(pool, tenants.a, "d-a")
    c = await tasks.create(pool, tenants.a, "d-c")
    await _run(pool, handlers)
    for t in (a, c):
        await signals.approve(pool, tenants.a, t.id, approver="alice")
    await _run(pool, handlers)
    for t in (a, c):
        assert (await tasks.get(pool, tenants.a, t.id)).state == "succeeded", t
    assert psp.requests == {f"{a.id}/charge": 1, f"{c.id}/charge": 1}


# The two traps a new user met following the README, written with the API the README
# showed then, exactly as it showed it. Both failed before the fix (the first died of
# its attempts with the provider never called again, the second slept for ever); the
# fix is in the library, not only in the straight-line API above.


class ProviderError(Exception):
    """A 503: what a payment API answers when it is down."""


class Timeout(Exception):
    """No answer in time."""


async def test_G13_a_reservation_left_by_an_exception_is_called_again_with_its_key(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """README (until 2026-12): the handler lets a provider's 503 propagate, leaving its
    operation reserved. Every later attempt logged OperationUnsettled and never called
    the provider again, until the task died. Now the next attempt calls it again with the
    same key, and the ledger says why."""
    calls: list[str] = []

    async def charge(invoice: int, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise ProviderError("503 service unavailable")
        return f"ch_{invoice}"

    async def send_invoice(job: Job) -> Succeed:
        inv = job.task.params["invoice"]
        res = await job.reserve(f"invoice-{inv}/charge", "charge", {"invoice": inv})
        if res.fresh:  # reserved and committed; no transaction is open now
            try:
                ref = await charge(inv, idempotency_key=res.operation.idempotency_key)
            except Timeout:
                await job.mark_unknown(res.operation, "timeout")  # may have happened
                raise  # retried with backoff
            await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
        return Succeed(outbox=(Message("invoice.paid", {"invoice": inv}),))

    task = await tasks.create(pool, tenants.a, "trap-503", params={"invoice": 42}, max_attempts=4)
    done = await _run(pool, {"trap-503": send_invoice})
    assert done.count("succeeded") == 1, done.tasks
    assert calls == ["invoice-42/charge", "invoice-42/charge"]
    assert await _op_events(pool, task.id) == [
        "operation.reserved", "operation.unknown", "operation.started", "operation.succeeded",
    ]  # fmt: skip


async def test_G22_G23_the_approval_and_child_task_examples_combined_wake_and_finish(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """README (until 2026-12): the approval example, then the child-task example, in one
    handler. The Wait for the children moved the signal cursor past the approval; the run
    after the fan-in read no approval and waited for a second one, for ever."""

    async def pay_invoice(job: Job) -> Wait | Succeed:
        seen = await job.signals()  # unread signals, in order
        if not any(s.kind == "approval" and s.decision == "approved" for s in seen):
            return Wait(signal="approval", until=None)  # sleep until one arrives
        lines = await job.children()  # each with its result, once finished
        if not lines:
            for i, line in enumerate(job.task.params["lines"]):
                await job.spawn("invoice_line", f"line-{i}", {"line": line})
            return Wait(children=True)  # all of them; Wait(children=2): a quorum
        return Succeed(payload={"total": sum(c.result["amount"] for c in lines if c.result)})

    async def invoice_line(job: Job) -> Succeed:
        return Succeed(payload={"amount": job.task.params["line"]})

    handlers = {"pay_invoice": pay_invoice, "invoice_line": invoice_line}
    task = await tasks.create(pool, tenants.a, "pay_invoice", params={"lines": [100, 250]})
    await _run(pool, handlers)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"
    await signals.approve(pool, tenants.a, task.id, approver="alice@acme", decision="approved")
    await _run(pool, handlers)
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.state == "succeeded", done
    result = await pool.fetchval(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND event_type = 'task.succeeded'",
        task.id,
    )
    assert json.loads(result) == {"total": 350}


# ---- cost and reach ----------------------------------------------------------------------


async def test_G25_replaying_k_recorded_steps_costs_one_round_trip(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    psp = Provider()
    held = await _claimed(pool, tenants.a, "d-replay")

    async def run(job: Job) -> list[Any]:
        return [
            await job.step("plan", lambda: {"plan": 1}),
            await job.effect("search/0", psp.call, "q0"),
            await job.step("draft", lambda: "text"),
            await job.effect("search/1", psp.call, "q1"),
            await job.step("check", lambda: True),
            await job.effect("send", psp.call, "to"),
        ]

    first = await run(Job(pool, held, reconcilers={}))
    statements: list[str] = []
    async with pool.acquire() as conn:
        conn.add_query_logger(lambda q: statements.append(q.query))
        replay = Job(conn, held, reconcilers={})  # type: ignore[arg-type]
        again = await run(replay)
    assert again == first
    assert len(statements) == 1, statements  # the ledger, once, for all six
    assert sum(psp.requests.values()) == 3


async def test_G20_a_cancel_stops_a_handler_inside_a_long_step_by_the_lease_watch(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The lease is a day long, so the heartbeat would not look for eight hours: only the
    worker's lease watch can stop the handler while it waits inside its step."""
    entered = asyncio.Event()
    stopped = asyncio.Event()

    async def long_model() -> str:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    async def agent(job: Job) -> Succeed:
        await job.step("think", long_model)
        return Succeed()

    task = await tasks.create(pool, tenants.a, "d-cancel", lease_ttl=timedelta(days=1))
    worker = Worker(pool, {"d-cancel": agent}, poll_interval=0.05, watch_interval=0.2)
    running = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(entered.wait(), 30)
        await tasks.cancel(pool, tenants.a, task.id, reason="customer asked")
        await asyncio.wait_for(stopped.wait(), 60)
    finally:
        worker.stop()
        await running
    assert worker.stats.cancelled == 1
    assert (await tasks.get(pool, tenants.a, task.id)).state == "cancelled"
    assert (await steps.ledger(pool, tenants.a, task.id)).steps == {}  # nothing recorded


async def test_G20_a_message_enqueued_for_a_cancelled_task_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "d-msg")
    async with pool.acquire() as conn, conn.transaction():  # the caller's own transaction
        await outbox.enqueue(conn, tenants.a, "invoice.sent", {"n": 1}, task_id=task.id)
    await tasks.cancel(pool, tenants.a, task.id)
    with pytest.raises(TaskFinished):
        async with pool.acquire() as conn, conn.transaction():
            await outbox.enqueue(conn, tenants.a, "invoice.sent", {"n": 2}, task_id=task.id)
    sent = await pool.fetchval("SELECT count(*) FROM agent_outbox WHERE task_id = $1", task.id)
    assert sent == 1


@pytest.mark.parametrize("first", ["cancel", "step"])
async def test_G20_G25_a_step_written_while_its_task_is_cancelled_is_refused_or_came_first(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection,
    first: str,
) -> None:  # fmt: skip
    """Closes issue 35's blind class "a write racing a task's end" for steps: a cancel and
    a step's record on two connections take turns on the task's row (agentdb_guard_step,
    the trigger agent_steps_guard, reads the task FOR SHARE against the cancel's row
    lock), so a step is either refused by the cancelled task or was recorded before the
    cancel - never recorded beside a cancel it did not see. ``cancel`` first: the record
    waits for it (its fence read the task 'running' before the cancel committed), then the
    guard refuses it (AG012, TaskFinished, which steps.record tells as the fence would:
    Cancelled) and nothing is recorded. ``step`` first: the cancel waits for the step's
    transaction, then goes on, and the step stays. Kills
    gen-0008.steps-agentdb_guard_step-lock-1 (the guard reads the task without the lock:
    the record reads 'running' and lands beside the cancel)."""
    held = await _claimed(pool, tenants.a, "d-racing-cancel")
    lease = held.lease
    assert lease is not None
    canceller, stepper = await db.connect(), await db.connect()
    cancelled, stepped, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls = _Calls()

    async def cancel() -> None:
        async with canceller.transaction():
            await tasks.cancel(canceller, tenants.a, held.id, reason="racing a step")
            cancelled.set()  # written, not committed
            await go.wait()

    async def record() -> steps.Step:
        args = {"kind": "step", "input_hash": F.HASH, "result": '{"n": 1}', "lease": lease}
        if first == "cancel":  # its own transaction: a refused statement leaves none open
            recorded = await steps.record(stepper, tenants.a, held.id, "plan", **args)
            stepped.set()
            return recorded
        async with stepper.transaction():
            recorded = await steps.record(stepper, tenants.a, held.id, "plan", **args)
            stepped.set()  # written, not committed
            await go.wait()
        return recorded

    try:
        if first == "cancel":
            cancelling = calls.add(cancel())
            await _reached(cancelled, cancelling)
            recording = calls.add(record())
            assert await _waits_for_a_lock(admin_conn, stepper, recording, stepped), (
                "the step was recorded beside an uncommitted cancel of its task"
            )
            go.set()
            await asyncio.wait_for(cancelling, 30)
            with pytest.raises(Cancelled):
                await asyncio.wait_for(recording, 30)
            assert (await steps.ledger(pool, tenants.a, held.id)).steps == {}
        else:
            recording = calls.add(record())
            await _reached(stepped, recording)
            cancelling = calls.add(cancel())
            assert await _waits_for_a_lock(admin_conn, canceller, cancelling, cancelled), (
                "the task was cancelled beside a step's uncommitted record"
            )
            go.set()
            step = await asyncio.wait_for(recording, 30)
            await asyncio.wait_for(cancelling, 30)
            assert (step.name, step.state) == ("plan", "done")
            assert list((await steps.ledger(pool, tenants.a, held.id)).steps) == ["plan"]
    finally:
        go.set()  # both transactions end before their connections close
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        await canceller.close()
        await stepper.close()
    assert (await tasks.get(pool, tenants.a, held.id)).state == "cancelled"


async def test_G25_code_a_handler_calls_finds_its_job_without_being_passed_it(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """What an agent framework's model and tool calls use: the running job, per handler."""
    found: dict[uuid.UUID, Any] = {}

    async def deep_inside() -> Any:
        await asyncio.sleep(0)
        return running_job()

    async def agent(job: Job) -> Succeed:
        # A task the handler starts (as frameworks run tools) sees the same job.
        found[job.task.id] = (job, await asyncio.create_task(deep_inside()))
        return Succeed()

    made = [await tasks.create(pool, tenants.a, "d-running") for _ in range(3)]
    done = await _run(pool, {"d-running": agent}, concurrency=3)
    assert done.count("succeeded") == 3
    assert set(found) == {t.id for t in made}
    assert all(inner is job for job, inner in found.values())
    assert running_job() is None  # outside a handler: none
