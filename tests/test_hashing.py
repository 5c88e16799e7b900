"""Canonical input hashing (G4): equal meaning hashes equal; different inputs hash different.

And every hash that answers a replay covers every field of the request, not only its
payload: a signal's name and sender (an approval's approver and decision), each part of a
schedule's definition, a durable step's keyword arguments. A replay that differs in one
field is refused; a field the docs leave out of a hash (a task's deadline, a schedule's
anchor) is answered as they say (issue 35's blind class: idempotency hashes).
"""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import asyncpg
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agentdb import children, leases, schedules, signals, tasks
from agentdb.errors import ConfigurationError, IdempotencyConflict, StepConflict
from agentdb.hashing import canonical_json, input_hash
from agentdb.worker import Job, Suspended
from tests.conftest import Tenants

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**60), 10**60)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_data = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _shuffle_keys(value: Any, rnd: st.DataObject) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        order = rnd.draw(st.permutations(range(len(items))))
        return {items[i][0]: _shuffle_keys(items[i][1], rnd) for i in order}
    if isinstance(value, list):
        return [_shuffle_keys(v, rnd) for v in value]
    return value


def _renormalise(value: Any, form: Literal["NFC", "NFD"]) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize(form, value)
    if isinstance(value, dict):
        return {unicodedata.normalize(form, k): _renormalise(v, form) for k, v in value.items()}
    if isinstance(value, list):
        return [_renormalise(v, form) for v in value]
    return value


def _reformat_numbers(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _reformat_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reformat_numbers(v) for v in value]
    return value


@given(json_data, st.data())
def test_G4_key_order_does_not_change_the_hash(value: Any, data: st.DataObject) -> None:
    assert input_hash(_shuffle_keys(value, data)) == input_hash(value)


@given(json_data)
def test_G4_unicode_normalisation_does_not_change_the_hash(value: Any) -> None:
    nfd = _renormalise(value, "NFD")
    try:
        expected = input_hash(_renormalise(value, "NFC"))
    except ConfigurationError:
        assume(False)  # two keys collapse into one under NFC: refused, by design
    assert input_hash(nfd) == expected


@given(json_data)
def test_G4_number_formatting_does_not_change_the_hash(value: Any) -> None:
    assert input_hash(_reformat_numbers(value)) == input_hash(value)


def _meaning(value: Any) -> Any:
    """``value`` with every number exact (a Decimal) and every string NFC: what it means."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {unicodedata.normalize("NFC", k): _meaning(v) for k, v in value.items()}
    return [_meaning(v) for v in value]


@given(json_data)
def test_G4_canonical_json_is_valid_json_with_exactly_the_same_meaning(value: Any) -> None:
    """Parsed back with exact numbers, it is the input itself: nothing is rounded away, so
    two inputs that mean different things never share a hash."""
    import json

    parsed = json.loads(canonical_json(value), parse_float=Decimal, parse_int=Decimal)
    assert _meaning(parsed) == _meaning(value)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (12345678901234567890123456789, 12345678901234567890123456788),  # 29 digits
        (10**40 + 1, 10**40),
        (-(10**30) - 7, -(10**30) - 8),
        (Decimal("1." + "2345678901" * 3 + "2"), Decimal("1." + "2345678901" * 3 + "1")),
        (Decimal("9" * 60 + "e-3"), Decimal("9" * 59 + "8e-3")),
    ],
    ids=["29-digit-ints", "41-digit-ints", "negative-31-digit-ints", "32-digit-decimals",
         "60-digit-decimals"],
)  # fmt: skip
def test_G4_numbers_beyond_28_digits_hash_differently(a: Any, b: Any) -> None:
    """Decimal's default context keeps 28 digits; the hash must keep every one."""
    assert input_hash(a) != input_hash(b)
    assert input_hash({"account": a}) != input_hash({"account": b})
    # The same number, written otherwise, still hashes alike.
    same = Decimal(f"{Decimal(a):E}".replace("E", "0E"))  # one more trailing zero
    assert input_hash(a) == input_hash(same)


def test_known_vectors() -> None:
    assert canonical_json({"b": 1.0, "a": [100, 1.5, Decimal("1.00"), -0.0, 0.1]}) == (
        b'{"a":[1e2,15e-1,1,0,1e-1],"b":1}'
    )
    assert canonical_json(True) != canonical_json(1)
    # mutmut's _encode mutant 11: False taken for the number 0 (it is an int too).
    assert canonical_json(False) == b"false"
    assert canonical_json([False, 0]) == b"[false,0]"
    assert canonical_json("1") != canonical_json(1)
    assert input_hash({}) == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    # Stored hashes stay valid across upgrades: these are what earlier versions computed.
    assert canonical_json([-100, Decimal("-0.0100"), 10**27, 123456789012345678901234567.8]) == (
        b"[-1e2,-1e-2,1e27,12345678901234568e10]"
    )
    assert input_hash({"to": "a@b.c", "n": 1250, "x": [0.5, None, True]}) == (
        "7e2ddbf9d1e5f04ad47fa2a003b1654ba01c5b5cde7c7d3c72342b6e1231ed22"
    )


_JSON_TYPES = "use JSON types (dict, list, str, int, float, Decimal, bool, None)"
_DEEP: list[Any] = []
for _ in range(5000):
    _DEEP = [_DEEP]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (float("nan"), "cannot hash a non-finite number: nan"),
        (float("inf"), "cannot hash a non-finite number: inf"),
        (b"bytes", f"cannot hash a value of type bytes: {_JSON_TYPES}"),
        ({1, 2}, f"cannot hash a value of type set: {_JSON_TYPES}"),
        ({1: "int key"}, "cannot hash an object key of type int"),
        ({"é": 1, "e\u0301": 2}, "two keys are equal after NFC normalisation: 'é'"),
        ("\ud800", "cannot hash a string that is not valid Unicode: 'utf-8' codec can't encode"),
        (_DEEP, "cannot hash a value nested this deeply"),
    ],
)
def test_non_json_inputs_are_refused_saying_what_is_wrong(bad: Any, message: str) -> None:
    """Kills mutmut's messages-lost mutants: _encode 32, 33, 42, 60-64, _number 8 and
    canonical_json 11-14."""
    with pytest.raises(ConfigurationError) as raised:
        input_hash(bad)
    assert str(raised.value).startswith(message), raised.value


# ---- every field of a request is in the hash that answers its replay ---------------------


async def test_G4_a_signal_key_replayed_with_another_name_or_sender_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Kills hash-signal-drops-name and hash-signal-drops-sender: the same payload from
    another sender, or as another signal, is another signal - never the first one's answer."""
    task = await tasks.create(pool, tenants.a, "h-signal")
    sent: dict[str, Any] = {"name": "note", "payload": {"n": 1}, "sender": "ops"}
    first = await signals.signal(pool, tenants.a, task.id, dedupe_key="k", **sent)
    again = await signals.signal(pool, tenants.a, task.id, dedupe_key="k", **sent)
    assert (again.created, again.id) == (False, first.id)  # control: a true retry
    for field, other in (("name", "escalate"), ("sender", "billing")):
        with pytest.raises(IdempotencyConflict) as refused:
            await signals.signal(pool, tenants.a, task.id, dedupe_key="k", **{**sent, field: other})
        assert refused.value.stored_hash == first.input_hash, field
    assert [s.id for s in await signals.received(pool, tenants.a, task.id)] == [first.id]


async def test_G4_an_approval_key_replayed_by_another_approver_or_decision_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Kills hash-signal-drops-sender and hash-signal-drops-decision: bob's approval is not
    alice's, and a rejection is not the approval recorded under its key - answering either
    with the first would tell the caller a decision that was never taken."""
    task = await tasks.create(pool, tenants.a, "h-approval")
    given = {"approver": "alice", "decision": "approved", "comment": "ok"}
    first = await signals.approve(pool, tenants.a, task.id, dedupe_key="r", **given)
    again = await signals.approve(pool, tenants.a, task.id, dedupe_key="r", **given)
    assert (again.created, again.id) == (False, first.id)  # control: a true retry
    for field, other in (("approver", "bob"), ("decision", "rejected"), ("comment", "no")):
        with pytest.raises(IdempotencyConflict):
            await signals.approve(
                pool, tenants.a, task.id, dedupe_key="r", **{**given, field: other}
            )
    [only] = await signals.received(pool, tenants.a, task.id)
    assert (only.id, only.sender, only.decision) == (first.id, "alice", "approved")


_EVERY = {"every": timedelta(minutes=5), "task_deadline": timedelta(hours=1)}
_CRON = {"cron": "0 9 * * 1", "catch_up": "latest"}
_BASE = {"workflow_version": "1", "params": {"report": "weekly", "to": ["a@b.c"]}}


@pytest.mark.parametrize(
    ("rule", "changed"),
    [
        (_CRON, {"task_type": "h-other"}),
        (_CRON, {"workflow_version": "2"}),
        (_CRON, {"params": {"report": "weekly", "to": ["x@y.z"]}}),
        (_CRON, {"catch_up": "all"}),
        (_EVERY, {"every": timedelta(minutes=6)}),
        (_EVERY, {"task_deadline": timedelta(hours=2)}),
        (_EVERY, {"task_deadline": None}),
    ],
    ids=["task-type", "workflow-version", "params", "catch-up", "every", "task-deadline",
         "no-task-deadline"],
)  # fmt: skip
async def test_G4_a_schedule_recreated_with_one_part_of_its_definition_changed_is_refused(
    pool: asyncpg.Pool, tenants: Tenants, rule: dict[str, Any], changed: dict[str, Any]
) -> None:
    """Kills hash-schedule-drops-task-type, -workflow-version, -params, -catch-up, -every and
    -task-deadline: a create by name answers with the schedule there only if it would do
    the same thing; one field changed is another schedule, and the first stays as it was."""
    definition = {"task_type": "h-report", **_BASE, **rule}
    first = await schedules.create(pool, tenants.a, "h-sched", **definition)
    again = await schedules.create(pool, tenants.a, "h-sched", **definition)
    assert (again.created, again.id) == (False, first.id)  # control: a true retry
    with pytest.raises(IdempotencyConflict):
        await schedules.create(pool, tenants.a, "h-sched", **{**definition, **changed})
    assert replace(await schedules.get(pool, tenants.a, "h-sched"), created=True) == first


async def test_G4_a_schedule_recreated_with_another_anchor_is_the_same_schedule(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The anchor is not part of the definition (schedules._definition): a retried create
    whose ``start_at`` was computed again is answered with the schedule there, first anchor
    kept. Kills hash-schedule-hashes-the-anchor."""
    start = datetime.now(UTC).replace(microsecond=0)
    first = await schedules.create(
        pool, tenants.a, "h-anchor", "h-tick", every=timedelta(minutes=1), start_at=start
    )
    for later in (start, start + timedelta(seconds=7)):
        again = await schedules.create(
            pool, tenants.a, "h-anchor", "h-tick", every=timedelta(minutes=1), start_at=later
        )
        assert (again.created, again.id, again.anchor) == (False, first.id, start)


async def test_G4_a_task_retried_with_a_recomputed_deadline_gets_the_first_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """tasks.create's hash covers params (and the type beside it), not the deadline: a
    retry computes ``now() + 1h`` again, and is answered with the first task, deadline
    included, as its docstring says. Kills hash-task-hashes-the-deadline."""
    soon = datetime.now(UTC) + timedelta(hours=1)
    first = await tasks.create(
        pool, tenants.a, "h-task", params={"n": 1}, dedupe_key="d", deadline=soon
    )
    again = await tasks.create(
        pool, tenants.a, "h-task", params={"n": 1}, dedupe_key="d",
        deadline=soon + timedelta(seconds=3), max_attempts=9,
    )  # fmt: skip
    assert (again.created, again.id) == (False, first.id)
    assert (again.deadline_at, again.max_attempts) == (first.deadline_at, first.max_attempts)
    assert replace(await tasks.get(pool, tenants.a, first.id), created=True) == first


async def _job(pool: asyncpg.Pool, tenant: Any, task_type: str) -> Job:
    await tasks.create(pool, tenant, task_type)
    [held] = await leases.claim(pool, "h-worker", task_types=[task_type])
    return Job(pool, held, reconcilers={})


async def test_G25_a_step_reached_with_other_keyword_arguments_is_a_conflict(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A step binds its keyword arguments to its name as it does its positional ones.
    Kills hash-step-drops-kwargs."""
    job = await _job(pool, tenants.a, "h-step")
    assert await job.step("quote", lambda *, amount: {"q": amount}, amount=5) == {"q": 5}
    job._ledger = None  # a re-entry reads the ledger again
    assert await job.step("quote", lambda *, amount: {"q": amount}, amount=5) == {"q": 5}
    with pytest.raises(StepConflict):
        await job.step("quote", lambda *, amount: {"q": amount}, amount=500)


async def test_G25_a_wait_or_sleep_reached_for_another_signal_or_duration_is_a_conflict(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A timed-out wait for 'approval' is not a wait for 'payment', and a sleep of 0 s that
    ended is not an hour's sleep: a re-entry that asks for another is refused, never handed
    the first one's outcome. Kills hash-wait-drops-signal and hash-sleep-drops-duration."""
    job = await _job(pool, tenants.a, "h-wait")
    assert await job.wait_for_signal("gate", "approval", timeout=timedelta(0)) is None
    await job.sleep("nap", timedelta(0))
    again = Job(pool, job.task, reconcilers={})
    assert await again.wait_for_signal("gate", "approval", timeout=timedelta(0)) is None
    await again.sleep("nap", timedelta(0))  # controls: true re-entries
    with pytest.raises(StepConflict):
        await again.wait_for_signal("gate", "payment", timeout=timedelta(0))
    with pytest.raises(StepConflict):
        await again.sleep("nap", timedelta(hours=1))


@pytest.mark.parametrize(
    "changed",
    [{"specs": [("h-kid", {"n": 1}), ("h-kid", {"n": 3})]}, {"quorum": 2}],
    ids=["children", "quorum"],
)
async def test_G25_a_fan_out_reached_for_other_children_or_another_quorum_is_a_conflict(
    changed: dict[str, Any], pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The children a fan-out spawned, and how many of them it waits for, are bound to its
    name: a re-entry asking for others is refused, never put to sleep on the first one's
    wait. Kills hash-children-drops-children and hash-children-drops-quorum."""
    asked: dict[str, Any] = {"specs": [("h-kid", {"n": 1}), ("h-kid", {"n": 2})], "quorum": 1}
    job = await _job(pool, tenants.a, "h-fan")
    with pytest.raises(Suspended):
        await job.run_children("fan", asked["specs"], quorum=asked["quorum"])
    again = Job(pool, job.task, reconcilers={})
    with pytest.raises(Suspended):  # control: a true re-entry sleeps on the same wait
        await again.run_children("fan", asked["specs"], quorum=asked["quorum"])
    other = {**asked, **changed}
    with pytest.raises(StepConflict):
        await Job(pool, job.task, reconcilers={}).run_children(
            "fan", other["specs"], quorum=other["quorum"]
        )
    assert await children.count(pool, tenants.a, job.task.id) == 2


async def test_G25_an_effect_key_reused_for_another_action_is_a_conflict(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """An effect's recorded answer is bound to its action as well as its arguments: a refund
    under the key a charge used is refused, never answered with the charge's result (the
    ledger answers a re-entry before the database is asked). Kills
    hash-effect-replay-ignores-action."""
    calls: list[str] = []

    async def provider(amount: int, *, idempotency_key: str) -> dict[str, int]:
        calls.append(idempotency_key)
        return {"amount": amount}

    job = await _job(pool, tenants.a, "h-effect")
    assert await job.effect("pay", provider, 5, key="k-1", action="charge") == {"amount": 5}
    again = Job(pool, job.task, reconcilers={})
    assert await again.effect("pay", provider, 5, key="k-1", action="charge") == {"amount": 5}
    with pytest.raises(StepConflict):
        await again.effect("pay", provider, 5, key="k-1", action="refund")
    assert calls == ["k-1"]
