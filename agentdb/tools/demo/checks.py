"""The counts of the demo's approvals, fan-outs, cancels and schedules (G20, G22-G24).

All from the database: agentdb's tables (tasks, events, signals, operations,
outbox, schedules) against the ledgers the demo keeps beside them in schema
``agentdb_demo`` - the provider's effects, the invoice handler's notes of the
signals each run was handed (``signal_reads``), the reviewer's reviews and
the canceller's cancels (:mod:`agentdb.tools.demo.actors`). They are read
apart and put together here: Citus cannot join a local table with a
distributed one.

Signals
    *Recorded once*: each approval is one row of ``agent_signals`` and one
    ``task.approved`` / ``task.rejected`` event, however often the reviewer
    sent it (its dedupe key). *Read once*: the invoice's ``review`` step
    takes one approval and records which (G25); every run of the task is
    handed that one again and no other - a run handed another approval than
    the recorded one, or an approval taken by two steps, was a second
    delivery. *Lost*: an approval that its task, still live when it finished
    or not at all, never took; or a task asleep on a signal that is there
    unread.
Steps
    The ``assess`` step's model is called once per task - again only by a
    run that died (or lost its lease) before its record was written, never
    after the record, and never twice by one run.
Wakes
    A parent is woken by the last of its children (``task.children_done``)
    once at most, and a task by a signal (``task.woken``) once at most: the
    demo's tasks wait for one approval, and for their children once. A
    parent asleep with all its children finished was never woken (lost). A
    parent that began its wait after its children finished was due at once
    and has no such event.
Cancels
    After the canceller's cancel returned, nothing new may happen for the
    task: no operation reserved, no child spawned, no outbox message, and no
    provider effect for an operation that agentdb had not granted
    (``operation.reserved`` / ``operation.retried``) before then. An effect
    of a call already granted that lands afterwards was in flight - the
    cancel never makes an effect disappear - and is counted apart.
Schedules
    After the pause every tick of a schedule from its anchor up to its next
    tick has exactly one task.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agentdb import _db
from agentdb.tasks import FINISHED_STATES
from agentdb.tools.demo.provider import REVIEW_ABOVE, TASK_TYPE

__all__ = ["FLOW_KEYS", "count_flows", "stalled"]

#: The keys :func:`count_flows` returns.
FLOW_KEYS = (
    "approved", "rejected", "reviews", "reviews_twice", "reviews_late", "approvals_miscounted",
    "approvals_read", "signals_read_twice", "lost_signals", "unapproved_charges",
    "model_steps", "model_calls", "model_again", "model_after_record",
    "children", "parents", "parents_woken", "double_wakes", "lost_wakes", "fan_in_wrong",
    "cancels", "cancelled", "cancelled_pending", "cancelled_running", "cancelled_waiting",
    "cancels_late", "after_cancel", "in_flight_at_cancel",
    "schedules", "ticks", "ticks_missed", "ticks_doubled", "other_stuck",
)  # fmt: skip

_INVOICES = (
    "SELECT id, state, params, wait_signal, signal_cursor, wait_children,"
    " wake_at > now() AS asleep FROM agent_tasks WHERE tenant_id = ANY ($1) AND task_type = $2"
)
_TASK_EVENTS = (
    "SELECT task_id, event_type, from_state, to_state, task_state_version, payload, created_at"
    " FROM agent_events WHERE tenant_id = ANY ($1) AND task_id = ANY ($2)"
    " AND operation_id IS NULL"
)
_SIGNALS = (
    "SELECT task_id, seq, name, kind, decision, created_at FROM agent_signals"
    " WHERE tenant_id = ANY ($1) AND task_id = ANY ($2)"
)
_CHILDREN = (
    "SELECT parent_id, state, created_at FROM agent_tasks"
    " WHERE tenant_id = ANY ($1) AND parent_id IS NOT NULL"
)
_OTHER_OPEN = (
    "SELECT count(*) FROM agent_tasks WHERE tenant_id = ANY ($1) AND task_type <> $2"
    " AND state NOT IN ('succeeded', 'failed', 'cancelled', 'dead')"
)
_OPERATIONS = (
    "SELECT id, task_id, idempotency_key, created_at FROM agent_operations"
    " WHERE tenant_id = ANY ($1) AND task_id = ANY ($2)"
)
_GRANTS = (
    "SELECT operation_id, created_at FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND task_id = ANY ($2) AND event_type IN ('operation.reserved', 'operation.retried')"
)
_OUTBOX = "SELECT task_id FROM agent_outbox WHERE tenant_id = ANY ($1) AND task_id = ANY ($2)"
_SCHEDULES = (
    "SELECT id, anchor, every, next_tick_at FROM agent_schedules WHERE tenant_id = ANY ($1)"
)
_TICKS = (
    "SELECT schedule_id, schedule_tick FROM agent_tasks"
    " WHERE tenant_id = ANY ($1) AND schedule_id IS NOT NULL"
)
_STEPS = (
    "SELECT task_id, name, signal_seq, lease_token, created_at FROM agent_steps"
    " WHERE tenant_id = ANY ($1) AND task_id = ANY ($2)"
)
# The demo's own ledgers (recreated for every run: no tenant to filter on).
_READS = "SELECT task_id, seq, lease_token FROM agentdb_demo.signal_reads"
_MODEL = "SELECT task_id, lease_token, at FROM agentdb_demo.model_calls"
_REVIEWS = "SELECT task_id, sends, outcome FROM agentdb_demo.reviews"
_CANCELS = "SELECT task_id, outcome, at FROM agentdb_demo.cancels"
_EFFECTS = "SELECT key, action, task_id, at FROM agentdb_demo.provider_effects"


def _payload(raw: Any) -> dict[str, Any]:
    value = json.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) else {}


def _twice(steps: list[_db.Record], reads: dict[tuple[uuid.UUID, int], set[int]]) -> int:
    """Approvals handed to a run that are not the one its review step recorded, and
    approvals taken by more than one step."""
    taken: dict[uuid.UUID, int] = {
        r["task_id"]: int(r["signal_seq"]) for r in steps if r["signal_seq"] is not None
    }
    by_step = Counter(
        (r["task_id"], int(r["signal_seq"])) for r in steps if r["signal_seq"] is not None
    )
    twice = sum(taken.get(task_id) != seq for task_id, seq in reads)
    return twice + sum(n - 1 for n in by_step.values())


def _model(steps: list[_db.Record], calls: list[_db.Record], found: dict[str, int]) -> None:
    """The ``assess`` step's model calls against its records (the docstring's rule)."""
    recorded = {r["task_id"]: r for r in steps if r["name"] == "assess"}
    found["model_steps"] = len(recorded)
    found["model_calls"] = len(calls)
    found["model_again"] = max(0, len(calls) - len(recorded))
    per_run = Counter((c["task_id"], c["lease_token"]) for c in calls)
    found["model_after_record"] = sum(n - 1 for n in per_run.values()) + sum(
        c["task_id"] in recorded and c["at"] > recorded[c["task_id"]]["created_at"] for c in calls
    )


async def stalled(db: _db.Executor, tenant_ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """Invoices asleep though what they wait for came: a signal there unread
    ('signal'), or every child they wait for finished ('children')."""
    tenants = list(tenant_ids)
    asleep = [
        r
        for r in await db.fetch(_INVOICES, tenants, TASK_TYPE)
        if r["state"] == "waiting" and r["asleep"]
    ]
    found = {"signal": 0, "children": 0}
    if not asleep:
        return found
    ids = [r["id"] for r in asleep]
    sigs = await db.fetch(_SIGNALS, tenants, ids)
    done: Counter[uuid.UUID] = Counter(
        r["parent_id"] for r in await db.fetch(_CHILDREN, tenants) if r["state"] in FINISHED_STATES
    )
    for r in asleep:
        if r["wait_signal"] is not None and any(
            s["task_id"] == r["id"] and s["name"] == r["wait_signal"]
            and s["seq"] > r["signal_cursor"] for s in sigs
        ):  # fmt: skip
            found["signal"] += 1
        if r["wait_children"] is not None and done[r["id"]] >= r["wait_children"]:
            found["children"] += 1
    return found


async def count_flows(  # noqa: PLR0915 - one count per key of FLOW_KEYS, read in one place
    db: _db.Executor, tenant_ids: Sequence[uuid.UUID]
) -> dict[str, int]:
    """The keys of :data:`FLOW_KEYS`, for the invoices of these tenants (see the docstring).

    Raises:
        asyncpg.PostgresError: the demo's schema is missing (not seeded).
    """
    tenants = list(tenant_ids)
    invoices = {r["id"]: r for r in await db.fetch(_INVOICES, tenants, TASK_TYPE)}
    ids = list(invoices)
    events = await db.fetch(_TASK_EVENTS, tenants, ids)
    by_type: dict[str, Counter[uuid.UUID]] = defaultdict(Counter)
    for e in events:
        by_type[e["event_type"]][e["task_id"]] += 1
    found: dict[str, int] = dict.fromkeys(FLOW_KEYS, 0)

    # Approvals: recorded once, read once, never lost, charged only when approved.
    approvals = [s for s in await db.fetch(_SIGNALS, tenants, ids) if s["kind"] == "approval"]
    found["approved"] = sum(by_type["task.approved"].values())
    found["rejected"] = sum(by_type["task.rejected"].values())
    rows = Counter(s["task_id"] for s in approvals)
    audited = by_type["task.approved"] + by_type["task.rejected"]
    reviews = await db.fetch(_REVIEWS)
    found["reviews"] = sum(r["outcome"] == "recorded" for r in reviews)
    found["reviews_twice"] = sum(r["outcome"] == "recorded" and r["sends"] > 1 for r in reviews)
    found["reviews_late"] = sum(r["outcome"] != "recorded" for r in reviews)
    found["approvals_miscounted"] = (
        sum(abs(rows[t] - audited[t]) for t in set(rows) | set(audited))
        + sum(n - 1 for n in rows.values() if n > 1)
        + sum(r["outcome"] == "recorded" and rows[r["task_id"]] != 1 for r in reviews)
    )
    reads: dict[tuple[uuid.UUID, int], set[int]] = defaultdict(set)
    for r in await db.fetch(_READS):
        reads[(r["task_id"], r["seq"])].add(r["lease_token"])
    steps = await db.fetch(_STEPS, tenants, ids)
    taken = {(r["task_id"], r["signal_seq"]) for r in steps if r["signal_seq"] is not None}
    found["approvals_read"] = sum((s["task_id"], s["seq"]) in taken for s in approvals)
    found["signals_read_twice"] = _twice(steps, reads)
    stuck = await stalled(db, tenants)
    found["lost_signals"] = stuck["signal"] + sum(
        (s["task_id"], s["seq"]) not in taken
        and invoices[s["task_id"]]["state"] in ("succeeded", "failed")
        for s in approvals
    )
    _model(steps, await db.fetch(_MODEL), found)
    approved_at = {s["task_id"]: s["created_at"] for s in approvals if s["decision"] == "approved"}
    effects = await db.fetch(_EFFECTS)
    for e in effects:
        inv = invoices.get(e["task_id"])
        large = inv is not None and _payload(inv["params"]).get("amount", 0) > REVIEW_ABOVE
        if e["action"] == "charge" and large:
            at = approved_at.get(e["task_id"])
            found["unapproved_charges"] += at is None or at > e["at"]

    # Fan-out and fan-in: every parent woken once at most, none never, totals right.
    kids = await db.fetch(_CHILDREN, tenants)
    found["children"] = len(kids)
    per_parent = Counter(k["parent_id"] for k in kids)
    found["parents"] = len(per_parent)
    found["parents_woken"] = len(by_type["task.children_done"])
    found["double_wakes"] = sum(
        n - 1 for kind in ("task.children_done", "task.woken") for n in by_type[kind].values()
    )
    found["lost_wakes"] = stuck["children"]
    for e in events:
        inv = invoices[e["task_id"]]
        params = _payload(inv["params"])
        if e["event_type"] == "task.succeeded" and params.get("lines"):
            paid = _payload(e["payload"])
            found["fan_in_wrong"] += (
                paid.get("total") != params["amount"]
                or paid.get("lines") != len(params["lines"])
                or per_parent[e["task_id"]] != len(params["lines"])
            )

    # Cancels: after the cancel returned, nothing agentdb had not granted before it.
    cancels = {r["task_id"]: r for r in await db.fetch(_CANCELS)}
    found["cancels"] = len(cancels)
    gone = {t: r["at"] for t, r in cancels.items() if r["outcome"] == "cancelled"}
    found["cancelled"] = len(gone)
    found["cancels_late"] = len(cancels) - len(gone)
    for e in events:
        if e["event_type"] == "task.cancelled" and e["task_id"] in gone:
            was = _payload(e["payload"]).get("from_state")
            if was in ("pending", "running", "waiting"):
                found[f"cancelled_{was}"] += 1
    found["after_cancel"] += sum(invoices[t]["state"] != "cancelled" for t in gone)
    if gone:
        found["after_cancel"] += await _after_cancel(db, tenants, gone, effects, kids, found)

    # Schedules: after the pause, one task per tick up to each one's next tick.
    rules = await db.fetch(_SCHEDULES, tenants)
    ticks: dict[uuid.UUID, list[datetime]] = defaultdict(list)
    for r in await db.fetch(_TICKS, tenants):
        ticks[r["schedule_id"]].append(r["schedule_tick"])
    found["schedules"] = len(rules)
    for s in rules:
        fired = [t for t in ticks[s["id"]] if t < s["next_tick_at"]]
        expected = int((s["next_tick_at"] - s["anchor"]) / s["every"]) if s["every"] else 0
        found["ticks"] += len(set(fired))
        found["ticks_missed"] += max(0, expected - len(set(fired)))
        found["ticks_doubled"] += len(ticks[s["id"]]) - len(set(ticks[s["id"]]))
    found["other_stuck"] = int(await db.fetchval(_OTHER_OPEN, tenants, TASK_TYPE) or 0)
    return found


async def _after_cancel(
    db: _db.Executor,
    tenants: list[uuid.UUID],
    gone: dict[uuid.UUID, datetime],
    effects: list[_db.Record],
    kids: list[_db.Record],
    found: dict[str, int],
) -> int:
    """What happened for a cancelled task after its cancel returned that agentdb had not
    granted before (and, into ``found``, the granted calls that landed after it)."""
    ids = list(gone)
    ops = await db.fetch(_OPERATIONS, tenants, ids)
    granted: dict[uuid.UUID, list[datetime]] = defaultdict(list)
    for g in await db.fetch(_GRANTS, tenants, ids):
        granted[g["operation_id"]].append(g["created_at"])
    op_of = {(o["task_id"], o["idempotency_key"]): o["id"] for o in ops}
    bad: int = sum(o["created_at"] > gone[o["task_id"]] for o in ops)
    bad += sum(k["parent_id"] in gone and k["created_at"] > gone[k["parent_id"]] for k in kids)
    bad += len(await db.fetch(_OUTBOX, tenants, ids))
    for e in effects:
        cancelled_at = gone.get(e["task_id"])
        if cancelled_at is None or e["at"] <= cancelled_at:
            continue
        op = op_of.get((e["task_id"], e["key"]))
        if op is not None and any(at < cancelled_at for at in granted[op]):
            found["in_flight_at_cancel"] += 1
        else:
            bad += 1
    return bad
