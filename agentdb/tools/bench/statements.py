"""Statement overhead: each agentdb helper against ``conn.fetch`` of its very SQL text.

Every pair runs the same statement with the same arguments on the same
connection. The raw side binds its arguments by the statement's declared
names (:meth:`agentdb._db.Query.bind`), as the helpers do, so a statement
whose ``$n`` are reordered fails loudly here instead of silently measuring
a different write; the raw side skips everything else the helper does
(defaults, payload checks, redaction, telemetry, row counts, typed errors).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString, TypeAlias

from agentdb import _db, leases, operations, tasks
from agentdb.models import Lease, Operation
from agentdb.tools.bench.harness import HOUR

__all__ = ["STATEMENTS", "Body", "Slot", "open_slots"]

_Q = _db.QUERIES
# What a hand-written settle would list; the helper uses operations.UNSETTLED.
_UNSETTLED = ["reserved", "in_flight", "unknown"]


@dataclass
class Slot:
    """One connection's own running task and lease, for statement overhead."""

    tenant: uuid.UUID
    lease: Lease
    version: int
    ops: list[Operation] = field(default_factory=list)
    raw_rows: list[_db.Record] = field(default_factory=list)
    used: int = 0

    @property
    def task_id(self) -> uuid.UUID:
        return self.lease.task_id

    @property
    def owner(self) -> str:
        return self.lease.owner

    @property
    def token(self) -> int:
        return self.lease.token

    def adopt_raw(self) -> None:
        """Take the operations the raw reserve runs left reserved, for the complete runs."""
        self.ops.extend(Operation.from_record(r) for r in self.raw_rows)
        self.raw_rows.clear()


async def open_slots(pool: _db.Pool, tenant: uuid.UUID, count: int) -> list[Slot]:
    """Claim one ``slot`` task per connection (seeded by the caller) and wrap its lease.

    Raises:
        RuntimeError: fewer ``slot`` tasks were due than ``count``.
    """
    slots: list[Slot] = []
    for i in range(count):
        claimed = await leases.claim(pool, f"stmt-{i}", lease_ttl=HOUR, task_types=["slot"])
        if len(claimed) != 1 or claimed[0].lease is None:
            raise RuntimeError("no slot task left to claim")
        slots.append(Slot(tenant, claimed[0].lease, claimed[0].state_version))
    return slots


def _digest(value: Any) -> str:
    """What a hand-written idempotency layer would hash: sorted-key JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: ``body(conn, slot, n, tag)``: run the statement ``n`` times on ``conn`` for ``slot``.
Body: TypeAlias = "Callable[[_db.Conn, Slot, int, str], Awaitable[None]]"


async def _transition_helper(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    for _ in range(n):
        t = await tasks.transition(
            conn,
            s.tenant,
            s.task_id,
            expected_version=s.version,
            to_state="running",
            step="bench",
            lease=s.lease,
        )
        s.version = t.state_version


async def _transition_raw(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    q = _Q["task_transition"]
    for _ in range(n):
        args = q.bind(
            {
                "tenant_id": s.tenant,
                "id": s.task_id,
                "expected_version": s.version,
                "to_state": "running",
                "set_step": True,
                "current_step": "bench",
                "wake_at": None,
                "last_error": None,
                "lease_owner": s.owner,
                "lease_token": s.token,
                "event_type": "task.running",
                "actor_id": s.owner,
                "payload": "{}",
                "outbox_ids": [],
                "outbox_topics": [],
                "outbox_payloads": [],
                "trace_id": None,
                "span_id": None,
                "wait_signal": None,
                "signal_cursor": None,
                "wait_children": None,
            }
        )
        rows = await conn.fetch(q.sql, *args)
        if len(rows) != 1:
            raise RuntimeError("raw transition matched no row")
        s.version = rows[0]["state_version"]


async def _reserve_helper(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    for i in range(n):
        res = await operations.reserve(
            conn, s.tenant, s.task_id, f"{tag}-{i}", "send", {"n": i}, lease=s.lease
        )
        s.ops.append(res.operation)


async def _reserve_raw(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    q = _Q["operation_reserve"]
    for i in range(n):
        args = q.bind(
            {
                "tenant_id": s.tenant,
                "id": uuid.uuid4(),
                "task_id": s.task_id,
                "idempotency_key": f"{tag}-{i}",
                "action": "send",
                "input_hash": _digest({"n": i}),
                "actor_id": s.owner,
                "lease_owner": s.owner,
                "lease_token": s.token,
                "trace_id": None,
                "span_id": None,
                "units": None,
                "amounts": None,
                "cost": None,
            }
        )
        rows = await conn.fetch(q.sql, *args)
        if len(rows) != 1 or not rows[0]["created"]:
            raise RuntimeError("raw reserve did not reserve")
        s.raw_rows.append(rows[0])


_PENDING_CLAIMS: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM agent_tasks WHERE task_type = 'claim' AND state = 'pending'"
    " AND wake_at <= now() AND attempts < max_attempts)"
)


async def _dry(conn: _db.Conn) -> None:
    """Raise when no ``claim`` task is left pending; return when an empty claim was contention.

    Zero rows from a claim is a legal answer while work remains: every due
    task the walk offered may be locked by other claimers at that instant
    (SKIP LOCKED), most often near the end of a tenant's backlog. Only an
    empty queue is the bench's own fault.

    Raises:
        RuntimeError: no pending ``claim`` task is left.
    """
    if not await conn.fetchval(_PENDING_CLAIMS):
        raise RuntimeError("the claim queue ran dry")


async def _claim_helper(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    done = 0
    while done < n:
        got = await leases.claim(conn, s.owner, batch=1, lease_ttl=HOUR, task_types=["claim"])
        if got:
            done += 1
        else:
            await _dry(conn)


async def _claim_raw(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    q = _Q["lease_claim"]
    args = q.bind(
        {
            "lease_owner": s.owner, "batch": 1, "lease_ttl": HOUR, "task_types": ["claim"],
            "after_tenant": None,
        }
    )  # fmt: skip
    done = 0
    while done < n:
        rows = await conn.fetch(q.sql, *args)
        if not rows:  # the helper's one look more under contention (leases.claim)
            rows = await conn.fetch(q.sql, *args)
        if rows:
            done += 1
        else:
            await _dry(conn)


async def _complete_helper(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    for op in s.ops[s.used : s.used + n]:
        await operations.complete(
            conn, op, result={"ok": True}, provider_reference="ref", lease=s.lease
        )
    s.used += n


async def _complete_raw(conn: _db.Conn, s: Slot, n: int, tag: str) -> None:
    q = _Q["operation_settle"]
    for op in s.ops[s.used : s.used + n]:
        args = q.bind(
            {
                "tenant_id": s.tenant,
                "id": op.id,
                "expected_version": op.state_version,
                "from_states": _UNSETTLED,
                "to_state": "succeeded",
                "provider_reference": "ref",
                "result": json.dumps({"ok": True}),
                "error": None,
                "actor_id": s.owner,
                "lease_owner": s.owner,
                "lease_token": s.token,
                "event_type": "operation.succeeded",
                "units": None,
                "amounts": None,
            }
        )
        rows = await conn.fetch(q.sql, *args)
        if len(rows) != 1:
            raise RuntimeError("raw complete matched no row")
    s.used += n


#: (statement, helper, raw), in the order they run: complete settles what reserve reserved.
STATEMENTS: tuple[tuple[str, Body, Body], ...] = (
    ("transition + event", _transition_helper, _transition_raw),
    ("reserve", _reserve_helper, _reserve_raw),
    ("claim", _claim_helper, _claim_raw),
    ("complete", _complete_helper, _complete_raw),
)
