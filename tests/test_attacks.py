"""Raw-SQL attacks on every constraint and guard trigger (G2-G24).

Each case pairs a positive control (a valid write that must be accepted, so
the attack cannot pass vacuously) with an attack that Postgres must refuse
with the expected SQLSTATE and the attacked object's name - and the refusal,
passed through agentdb's error mapping, must come out as the expected error
class carrying the guarantee of the object's rule. Attacks run as the
role that would make them: the runtime login for ordinary writes; the
superuser for owner-only tables and for CHECKs that a guard trigger would
otherwise refuse first (with session_replication_role = replica, so the CHECK
is shown to hold even when triggers are switched off).

test_every_constraint_is_attacked ties this list to the schema: a new
constraint without an attack fails the suite; test_every_guard_rule_is_attacked
does the same for each rule of a guard that raises several SQLSTATEs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from agentdb import _db, errors
from agentdb.guarantees import RULES, guarantee_of
from agentdb.testing._postgres import EVENTS_BY_MONTH
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants

# Citus refuses an UPDATE of the distribution column itself (0A000), before
# the version guard sees the row.
PARTITION_COLUMN = "0A000"
# A deferred check that fails at a worker's COMMIT comes back from Citus as
# "could not commit transaction for shard ..." (XX000): refused, not typed.
FAILED_COMMIT = "XX000"
ABSENT = "absent"
# Global rate limits cannot be single-shard: on a distributed schema their
# table refuses every row (agent_global_rate_limits_local_only).
NO_GLOBAL_LIMITS = "no-global-limits"

NOW = datetime.now(UTC)
PAST = NOW - timedelta(days=1)
FUTURE = NOW + timedelta(days=1)
LONG = "x" * 4001


@dataclass(frozen=True)
class Ctx:
    a: uuid.UUID
    b: uuid.UUID
    task_a: uuid.UUID
    task_b: uuid.UUID
    op_a: uuid.UUID
    op_b: uuid.UUID


Step = Callable[[asyncpg.Connection, Ctx], Awaitable[Any]]


@dataclass(frozen=True)
class Case:
    name: str
    sqlstate: str
    good: Step
    bad: Step
    role: str = "runtime"  # runtime | admin | replica
    label: str = ""
    constraint: str | None = field(default=None)
    # On Citus (make test-citus) some writes are refused by Citus itself, before
    # or instead of our guard: the SQLSTATE it refuses with there. ABSENT: the
    # object does not exist on a distributed schema (0012.citus says why).
    citus: str | None = None

    @property
    def guarantee(self) -> str | None:
        return guarantee_of(self.name, self.sqlstate)

    @property
    def id(self) -> str:
        suffix = f"-{self.label}" if self.label else ""
        return f"{self.guarantee}-{self.name}{suffix}"


def _resolve(ctx: Ctx, kw: dict[str, Any]) -> dict[str, Any]:
    return {k: (v(ctx) if callable(v) else v) for k, v in kw.items()}


def task(tenant: str = "a", **kw: Any) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        return await F.create_task(conn, getattr(ctx, tenant), **_resolve(ctx, kw))

    return step


def raw_task(**kw: Any) -> Step:
    """Insert a task row alone (for replica-mode attacks, where no event is needed)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        return await F.insert(conn, "agent_tasks", F.task_row(ctx.a, **_resolve(ctx, kw)))

    return step


def op(tenant: str = "a", **kw: Any) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        kw2 = _resolve(ctx, kw)
        task_id = kw2.pop("task_id", getattr(ctx, f"task_{tenant}"))
        return await F.create_operation(conn, getattr(ctx, tenant), task_id, **kw2)

    return step


def raw_op(**kw: Any) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        row = F.operation_row(ctx.a, ctx.task_a, **_resolve(ctx, kw))
        return await F.insert(conn, "agent_operations", row)

    return step


def row(table: str, base: Callable[[Ctx], dict[str, Any]], **kw: Any) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        return await F.insert(conn, table, {**base(ctx), **_resolve(ctx, kw)})

    return step


def ev(**kw: Any) -> Step:
    return row(
        "agent_events",
        lambda c: {
            "tenant_id": c.a,
            "task_id": c.task_a,
            "event_type": "note",
            "actor_id": "tests",
            "policy_version": "p1",
        },
        **kw,
    )


def outbox(**kw: Any) -> Step:
    return row("agent_outbox", lambda c: {"tenant_id": c.a, "topic": "task.done"}, **kw)


def inbox(**kw: Any) -> Step:
    return row(
        "agent_inbox",
        lambda c: {"tenant_id": c.a, "consumer": "billing", "message_id": uuid.uuid4()},
        **kw,
    )


def artifact(**kw: Any) -> Step:
    return row(
        "agent_artifacts",
        lambda c: {"tenant_id": c.a, "kind": "report", "uri": "s3://bucket/key"},
        **kw,
    )


def cred(**kw: Any) -> Step:
    return row(
        "agent_credential_refs",
        lambda c: {
            "tenant_id": c.a,
            "name": f"cred-{uuid.uuid4().hex[:6]}",
            "provider": "openai",
            "secret_ref": "vault://kv/acme/openai",
        },
        **kw,
    )


def cap(*, upsert: bool = False, **kw: Any) -> Step:
    """A cap for tenant a; ``upsert`` replaces one the control already set."""
    statement = (
        "INSERT INTO agent_concurrency_limits (tenant_id, task_type, max_running)"
        " VALUES ($1, $2, $3)"
    )
    if upsert:
        statement += (
            " ON CONFLICT (tenant_id, task_type) DO UPDATE SET max_running = EXCLUDED.max_running"
        )

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        values = {"tenant_id": ctx.a, "task_type": "*", "max_running": 5, **_resolve(ctx, kw)}
        return await conn.execute(statement, *values.values())

    return step


def set_cap(**kw: Any) -> Step:
    return cap(upsert=True, **kw)


async def _start_task(conn: asyncpg.Connection, ctx: Ctx) -> None:
    """A hand-written claim of a fresh task of tenant a (type 'summarise'), with its events."""
    tid = await F.create_task(conn, ctx.a)
    async with conn.transaction():
        await F.claim_task(conn, ctx.a, tid)


def tenant(**kw: Any) -> Step:
    return row("agent_tenants", lambda c: {"id": uuid.uuid4(), "name": f"t-{uuid.uuid4()}"}, **kw)


def principal(**kw: Any) -> Step:
    return row(
        "agent_principals",
        lambda c: {"role_name": f"r{uuid.uuid4().hex[:8]}", "tenant_id": c.a},
        **kw,
    )


def edge(**kw: Any) -> Step:
    return row(
        "agent_transitions",
        lambda c: {"entity": "task", "from_state": "waiting", "to_state": "failed"},
        **kw,
    )


def pin(**kw: Any) -> Step:
    return row("agent_semconv_pins", lambda c: {"version": "1.37.0"}, **kw)


async def _repin(conn: asyncpg.Connection, ctx: Ctx) -> None:
    await conn.execute("UPDATE agent_semconv_pins SET version = '9.9.9'")


def task_change(*, claim: bool = False, **changes: Any) -> Step:
    """Create a fresh task in tenant a (optionally claimed), then update it with its event."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        tid = await F.create_task(conn, ctx.a)
        version = 1
        if claim:
            await F.claim_task(conn, ctx.a, tid)
            version = 2
        values = _resolve(ctx, changes)
        values.setdefault("state_version", version)
        return await F.update_task(conn, ctx.a, tid, **values)

    return step


def op_change(*path: dict[str, Any]) -> Step:
    """Create a fresh operation, then apply each change in turn (each with its event)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        oid = await F.create_operation(conn, ctx.a, ctx.task_a)
        for version, changes in enumerate(path, start=1):
            values = _resolve(ctx, changes)
            values.setdefault("state_version", version)
            await F.update_operation(conn, ctx.a, oid, **values)
        return oid

    return step


def outbox_change(*path: dict[str, Any]) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        mid = await F.insert(conn, "agent_outbox", {"tenant_id": ctx.a, "topic": "t"})
        for changes in path:
            await F.update_row(conn, "agent_outbox", ctx.a, mid, **changes)
        return mid

    return step


def seq(*steps: Step) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        for one in steps:
            await one(conn, ctx)

    return step


def sql(statement: str, *args: Callable[[Ctx], Any]) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        return await conn.execute(statement, *(a(ctx) for a in args))

    return step


async def _state_change_without_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    async with conn.transaction():
        await conn.execute(
            "UPDATE agent_tasks SET current_step = 'fetch', state_version = 1"
            " WHERE tenant_id = $1 AND id = $2",
            ctx.a,
            tid,
        )


async def _op_change_without_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    oid = await F.create_operation(conn, ctx.a, ctx.task_a)
    async with conn.transaction():
        await conn.execute(
            "UPDATE agent_operations SET state = 'in_flight', state_version = 1"
            " WHERE tenant_id = $1 AND id = $2",
            ctx.a,
            oid,
        )


async def _heartbeat(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid)
    # A renewal moves only lease_expires_at: no version bump, no event needed.
    # (The new instant is computed first: Citus refuses a STABLE operator on a
    # column in a SET.)
    expires = await conn.fetchval(
        "SELECT lease_expires_at FROM agent_tasks WHERE tenant_id = $1 AND id = $2", ctx.a, tid
    )
    await conn.execute(
        "UPDATE agent_tasks SET lease_expires_at = $3 WHERE tenant_id = $1 AND id = $2",
        ctx.a,
        tid,
        expires + timedelta(minutes=1),
    )


async def _regrant_same_token(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid, owner="worker-1", token=1)
    await F.update_task(conn, ctx.a, tid, state_version=2, lease_owner="worker-2", lease_token=1)


async def _regrant_new_token(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid, owner="worker-1", token=1)
    await F.update_task(conn, ctx.a, tid, state_version=2, lease_owner="worker-2", lease_token=2)


async def _reacquire_same_token(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid, owner="worker-1", token=1)
    await F.update_task(
        conn, ctx.a, tid, state_version=2, lease_acquired_at=NOW + timedelta(seconds=1)
    )


async def _reclaim_after_release_same_token(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid, owner="worker-1", token=1)
    await F.update_task(
        conn,
        ctx.a,
        tid,
        state="pending",
        state_version=2,
        lease_owner=None,
        lease_acquired_at=None,
        lease_expires_at=None,
    )
    await F.claim_task(conn, ctx.a, tid, owner="worker-1", token=1, version=3)


async def _token_backwards(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid, token=5)
    await F.update_task(conn, ctx.a, tid, state_version=2, lease_token=4)


def _expired_event(conn: asyncpg.Connection, ctx: Ctx) -> Awaitable[Any]:
    return F.event(conn, ctx.a, ctx.task_a, payload_expires_at=PAST, retain_until=PAST)


async def _delete_expired_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await _expired_event(conn, ctx)
    status = await conn.execute(
        "DELETE FROM agent_events WHERE tenant_id = $1 AND id = $2", ctx.a, eid
    )
    assert status == "DELETE 1"


async def _delete_retained_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await F.event(conn, ctx.a, ctx.task_a)
    await conn.execute("DELETE FROM agent_events WHERE tenant_id = $1 AND id = $2", ctx.a, eid)


def _delete_event_retained_until(offset: timedelta) -> Step:
    """Delete an event retained until the transaction's own now() + ``offset``: retention
    ends *at* retain_until, so offset 0 may go and a microsecond more may not (kills
    gen-0004.events-agentdb_guard_append_only-cmp-3, `<=` -> `<`)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> None:
        async with conn.transaction():  # one now() for the insert and the delete
            until = await conn.fetchval("SELECT now()") + offset
            eid = await F.event(
                conn, ctx.a, ctx.task_a, payload_expires_at=until, retain_until=until
            )
            status = await conn.execute(
                "DELETE FROM agent_events WHERE tenant_id = $1 AND id = $2", ctx.a, eid
            )
            assert status == "DELETE 1"

    return step


async def _erase_payload(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await F.event(conn, ctx.a, ctx.task_a, payload='{"k": 1}')
    status = await conn.execute(
        "UPDATE agent_events SET payload = NULL WHERE tenant_id = $1 AND id = $2", ctx.a, eid
    )
    assert status == "UPDATE 1"


async def _rewrite_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await F.event(conn, ctx.a, ctx.task_a)
    await conn.execute(
        "UPDATE agent_events SET actor_id = 'someone-else' WHERE tenant_id = $1 AND id = $2",
        ctx.a,
        eid,
    )


async def _erase_and_rewrite(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await F.event(conn, ctx.a, ctx.task_a, payload='{"k": 1}')
    await conn.execute(
        "UPDATE agent_events SET payload = NULL, event_type = 'forged'"
        " WHERE tenant_id = $1 AND id = $2",
        ctx.a,
        eid,
    )


async def _count_events(conn: asyncpg.Connection, ctx: Ctx) -> None:
    assert await conn.fetchval("SELECT count(*) FROM agent_events") > 0


async def _runtime_rewrites_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    await conn.execute("UPDATE agent_events SET actor_id = 'x' WHERE tenant_id = $1", ctx.a)


async def _runtime_deletes_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    await conn.execute("DELETE FROM agent_events WHERE tenant_id = $1", ctx.a)


async def _runtime_appends_event(conn: asyncpg.Connection, ctx: Ctx) -> None:
    await F.event(conn, ctx.a, ctx.task_a)


def keyed_task_change(**changes: Any) -> Step:
    """Create a task created under a dedupe key (with its hash), then update it."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        tid = await F.create_task(conn, ctx.a, dedupe_key=f"k-{uuid.uuid4()}", input_hash=F.HASH)
        return await F.update_task(conn, ctx.a, tid, state_version=1, **_resolve(ctx, changes))

    return step


async def _finish_task(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = await F.create_task(conn, ctx.a)
    await F.claim_task(conn, ctx.a, tid)
    await F.update_task(
        conn, ctx.a, tid, state="succeeded", state_version=2, lease_owner=None,
        lease_acquired_at=None, lease_expires_at=None,
    )  # fmt: skip
    await conn.execute("SELECT set_config('agentdb_test.last_task', $1, false)", str(tid))


async def _reopen_last_task(conn: asyncpg.Connection, ctx: Ctx) -> None:
    tid = uuid.UUID(await conn.fetchval("SELECT current_setting('agentdb_test.last_task')"))
    await F.update_task(conn, ctx.a, tid, state="pending", state_version=3)


async def _op_moves_to_another_task(conn: asyncpg.Connection, ctx: Ctx) -> None:
    other = await F.create_task(conn, ctx.a)
    oid = await F.create_operation(conn, ctx.a, ctx.task_a)
    await F.update_operation(conn, ctx.a, oid, state_version=1, task_id=other)


async def _rewrite_payload(conn: asyncpg.Connection, ctx: Ctx) -> None:
    eid = await F.event(conn, ctx.a, ctx.task_a, payload='{"k": 1}')
    await conn.execute(
        """UPDATE agent_events SET payload = '{"k": 2}' WHERE tenant_id = $1 AND id = $2""",
        ctx.a,
        eid,
    )


FIXED = uuid.UUID("00000000-0000-4000-8000-000000000001")
H2 = "b" * 64
BIG = '{"blob": "' + "y" * 70000 + '"}'
BIG_EVENT = '{"blob": "' + "y" * 9000 + '"}'
# jsonb prints {"blob": "..."}: 12 bytes around the blob.
AT_LIMIT = '{"blob": "' + "y" * (65536 - 12) + '"}'
OVER_LIMIT = '{"blob": "' + "y" * (65537 - 12) + '"}'
H = F.HASH
LEASE: dict[str, Any] = {"lease_owner": "w", "lease_token": 1, "lease_acquired_at": NOW}


# ---- budgets and rate limits (G19) ------------------------------------------------------
_BUDGET = uuid.UUID("00000000-0000-4000-8000-0000000000b1")  # one id per tenant, so reusable


def budget(**kw: Any) -> Step:
    return row(
        "agent_budgets",
        lambda c: {"tenant_id": c.a, "unit": f"u{uuid.uuid4().hex[:8]}", "limit_amount": 100},
        **kw,
    )


def _with_budget(step: Step) -> Step:
    """``step`` after tenant a's budget _BUDGET exists (created once per test)."""

    async def run(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        await conn.execute(
            "INSERT INTO agent_budgets (tenant_id, id, unit, limit_amount)"
            " VALUES ($1, $2, 'tok', 100) ON CONFLICT DO NOTHING",
            ctx.a,
            _BUDGET,
        )
        return await step(conn, ctx)

    return run


def hold(**kw: Any) -> Step:
    return _with_budget(
        row(
            "agent_budget_holds",
            lambda c: {
                "tenant_id": c.a,
                "operation_id": c.op_a,
                "attempt": 1,
                "budget_id": _BUDGET,
                "unit": "tok",
                "amount": 5,
            },
            **kw,
        )
    )


def hold_change(start: dict[str, Any], **changes: Any) -> Step:
    """A fresh hold of tenant a (attempt numbers never repeat), then one UPDATE of it."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        attempt = uuid.uuid4().int % 1_000_000 + 2
        await hold(attempt=attempt, **start)(conn, ctx)
        sets = ", ".join(f"{k} = ${i}" for i, k in enumerate(changes, start=3))
        return await conn.execute(
            f"UPDATE agent_budget_holds SET {sets} WHERE tenant_id = $1 AND attempt = $2",  # noqa: S608
            ctx.a,
            attempt,
            *changes.values(),
        )

    return step


def budget_change(start: dict[str, Any], **changes: Any) -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        bid = await budget(**start)(conn, ctx)
        return await conn.execute(
            F._update_sql("agent_budgets", changes, "id"),
            ctx.a,
            bid,
            *changes.values(),
        )

    return step


def rate(**kw: Any) -> Step:
    return row(
        "agent_rate_limits",
        lambda c: {
            "tenant_id": c.a,
            "action": f"a-{uuid.uuid4().hex[:8]}",
            "max_calls": 5,
            "per": timedelta(minutes=1),
        },
        **kw,
    )


def global_rate(**kw: Any) -> Step:
    return row(
        "agent_global_rate_limits",
        lambda c: {"action": f"g-{uuid.uuid4().hex}", "max_calls": 5, "per": timedelta(minutes=1)},
        **kw,
    )


def _calls(max_calls: int, n: int, *, retry: bool = False) -> Step:
    """A rate limit of ``max_calls`` on a fresh action of tenant a, then ``n`` operations
    of it by raw INSERTs - or (``retry``) one operation failed and re-armed ``n`` times."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        action = f"rl-{uuid.uuid4().hex[:8]}"
        await rate(action=action, max_calls=max_calls)(conn, ctx)
        if not retry:
            for _ in range(n):
                await F.create_operation(conn, ctx.a, ctx.task_a, action=action)
            return None
        oid = await F.create_operation(conn, ctx.a, ctx.task_a, action=action)
        version = 1
        for attempt in range(2, n + 2):
            await F.update_operation(conn, ctx.a, oid, state="failed", state_version=version)
            await F.update_operation(
                conn, ctx.a, oid, state="reserved", attempts=attempt, state_version=version + 1
            )
            version += 2
        return oid

    return step


def _for_task(
    finished: str | None,
    *,
    retry: bool = False,
    deadline: datetime | None = None,
    passed_after: bool = False,
) -> Step:
    """A raw reservation for a fresh task of tenant a (with ``deadline``) - still open
    (``finished`` None), or moved to ``finished`` first: a new operation, or (``retry``) a
    failed one re-armed, after its deadline passed if ``passed_after``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a, deadline_at=deadline)
        if not retry:
            if finished in ("succeeded", "failed"):  # a worker's outcome: through running
                await F.claim_task(conn, ctx.a, task_id)
                await F.update_task(conn, ctx.a, task_id, state=finished, state_version=2,
                                    lease_owner=None, lease_acquired_at=None,
                                    lease_expires_at=None)  # fmt: skip
            elif finished:
                await F.update_task(conn, ctx.a, task_id, state=finished, state_version=1)
            return await F.create_operation(conn, ctx.a, task_id)
        oid = await F.create_operation(conn, ctx.a, task_id)
        await F.update_operation(conn, ctx.a, oid, state="failed", state_version=1)
        if finished:
            await F.update_task(conn, ctx.a, task_id, state=finished, state_version=1)
        elif passed_after:
            # The deadline passes after the first attempt (a deadline not yet passed moves).
            await F.update_task(conn, ctx.a, task_id, deadline_at=PAST, state_version=1)
        return await F.update_operation(
            conn, ctx.a, oid, state="reserved", attempts=2, state_version=2
        )

    return step


def _late(move: str) -> Step:
    """A task of tenant a past its deadline (``PAST``), then one raw write to it: ``to_dead``
    / ``to_cancelled`` / ``claim`` from pending; ``finish`` / ``finish_dead`` from running
    (the deadline passed while it ran); ``extend`` of the passed deadline; ``extend_open`` of
    one that has not passed; ``retry`` (an operator's: dead back to pending) of a task past
    its deadline, ``retry_open`` of one within it."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        if move.startswith("retry"):  # dead, then back to pending (0013.operator's edge)
            task_id = await F.create_task(
                conn, ctx.a, deadline_at=PAST if move == "retry" else FUTURE
            )
            await F.update_task(conn, ctx.a, task_id, state="dead", state_version=1)
            return await F.update_task(conn, ctx.a, task_id, state="pending", state_version=2)
        if move == "extend_open":
            task_id = await F.create_task(conn, ctx.a, deadline_at=FUTURE)
            return await F.update_task(
                conn, ctx.a, task_id, deadline_at=FUTURE + timedelta(days=1), state_version=1
            )
        running = move.startswith("finish")
        task_id = await F.create_task(conn, ctx.a, deadline_at=FUTURE if running else PAST)
        version = 1
        if running:
            version = await F.claim_task(conn, ctx.a, task_id) + 1
            # A deadline that has not passed may move: here it passes while the task runs.
            version = await F.update_task(
                conn, ctx.a, task_id, deadline_at=PAST, state_version=version
            ) + 1  # fmt: skip
        moves: dict[str, dict[str, Any]] = {
            "to_dead": {"state": "dead"},
            "to_cancelled": {"state": "cancelled"},
            "claim": {"state": "running", "lease_owner": "w", "lease_token": 1,
                      "lease_acquired_at": NOW, "lease_expires_at": NOW + timedelta(hours=1)},
            "finish": {"state": "succeeded", "lease_owner": None, "lease_acquired_at": None,
                       "lease_expires_at": None},
            "finish_dead": {"state": "dead", "lease_owner": None, "lease_acquired_at": None,
                            "lease_expires_at": None},
            "extend": {"deadline_at": FUTURE},
        }  # fmt: skip
        return await F.update_task(conn, ctx.a, task_id, **moves[move], state_version=version)

    return step


_SIGNAL = uuid.UUID("00000000-0000-4000-8000-0000000000c1")  # one fixed signal id per test


def _sig(
    *,
    task_state: str | None = None,
    deadline: datetime | None = None,
    held_by: str | None = None,
    on: str = "fresh",
    **row: Any,
) -> Step:
    """A raw signal (``row`` overrides its columns) to a fresh task of tenant a - open, or
    first moved to ``task_state``, given ``deadline``, or claimed by ``held_by``; ``on="a"``
    aims it at the context's task of tenant a (shared by both steps of a case), ``on="b"``
    at tenant b's while the row says tenant a."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        if on == "fresh":
            task_id = await F.create_task(conn, ctx.a, deadline_at=deadline)
        else:
            task_id = ctx.task_a if on == "a" else ctx.task_b
        if task_state:
            await F.update_task(conn, ctx.a, task_id, state=task_state, state_version=1)
        if held_by:
            await F.claim_task(conn, ctx.a, task_id, owner=held_by)
        return await F.signal(conn, ctx.a, task_id, **_resolve(ctx, row))

    return step


def _cursor(moves: tuple[int, ...], *, sibling_signals: int = 0) -> Step:
    """A fresh task of tenant a with one signal, its cursor then moved to each of ``moves``;
    first, another task of tenant a sent ``sibling_signals`` signals."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        if sibling_signals:
            sibling = await F.create_task(conn, ctx.a)
            for _ in range(sibling_signals):
                await F.signal(conn, ctx.a, sibling)
        task_id = await F.create_task(conn, ctx.a)
        await F.signal(conn, ctx.a, task_id)
        for version, to in enumerate(moves, start=1):
            await F.update_task(conn, ctx.a, task_id, signal_cursor=to, state_version=version)
        return task_id

    return step


def _signal_changed() -> Step:
    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        sid = await F.signal(conn, ctx.a, await F.create_task(conn, ctx.a))
        return await conn.execute(
            "UPDATE agent_signals SET payload = '{\"n\": 2}' WHERE id = $1", sid
        )

    return step


def _child(*, parent_state: str | None = None, parent_of: str = "a", **row: Any) -> Step:
    """A raw child (``row`` overrides its columns) of tenant a under a fresh parent of tenant
    ``parent_of``, first moved to ``parent_state`` if given."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        parent = await F.create_task(conn, getattr(ctx, parent_of))
        if parent_state:
            await F.update_task(conn, getattr(ctx, parent_of), parent, state=parent_state,
                                state_version=1)  # fmt: skip
        return await F.create_task(conn, ctx.a, parent_id=parent, **_resolve(ctx, row))

    return step


def _sibling(key: str) -> Step:
    """A child with ``key`` of the context's task of tenant a (shared by both steps)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        return await F.create_task(conn, ctx.a, parent_id=ctx.task_a, child_key=key)

    return step


RC, RR = "read_committed", "repeatable_read"
INFINITY = datetime.max.replace(tzinfo=UTC)


def _sig_at(isolation: str) -> Step:
    """A signal to a fresh task of tenant a, sent in a transaction at ``isolation``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a)
        async with conn.transaction(isolation=isolation):  # type: ignore[arg-type]
            return await F.signal(conn, ctx.a, task_id)

    return step


def _wait_at(isolation: str, *, on: str) -> Step:
    """A fresh task of tenant a set to wait, at ``isolation``, for what it does not have:
    ``on="signal"`` a signal named go (none sent), ``on="children"`` its one open child."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a)
        wait: dict[str, Any] = {"wait_signal": "go"}
        if on == "children":
            await F.create_task(conn, ctx.a, parent_id=task_id, child_key="c1")
            wait = {"wait_children": 1}
        async with conn.transaction(isolation=isolation):  # type: ignore[arg-type]
            return await F.update_task(conn, ctx.a, task_id, state="waiting", wake_at=INFINITY,
                                       state_version=1, **wait)  # fmt: skip

    return step


def _parent_ended_at(isolation: str) -> Step:
    """A parent of tenant a waiting for its one open child, then cancelled - a raw write
    that leaves wait_children as it was - in a transaction at ``isolation``: an end, not a
    wait, so nothing is counted and any level will do. (Kills generated
    ``gen-0006.control_flow-agent_tasks_children_guard-and-1``: the WHEN without
    ``NEW.state = 'waiting'`` sends the end to the guard, which refuses it at RR, AG016.)"""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        parent = await F.create_task(conn, ctx.a)
        await F.create_task(conn, ctx.a, parent_id=parent, child_key="c1")
        await F.update_task(conn, ctx.a, parent, state="waiting", wake_at=INFINITY,
                            wait_children=1, state_version=1)  # fmt: skip
        async with conn.transaction(isolation=isolation):  # type: ignore[arg-type]
            return await F.update_task(conn, ctx.a, parent, state="cancelled", state_version=2)

    return step


def _fan_in_at(isolation: str) -> Step:
    """A parent of tenant a waiting for its one child, which then finishes (cancelled) in a
    transaction at ``isolation``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        parent = await F.create_task(conn, ctx.a)
        child = await F.create_task(conn, ctx.a, parent_id=parent, child_key="c1")
        await F.update_task(conn, ctx.a, parent, state="waiting", wake_at=INFINITY,
                            wait_children=1, state_version=1)  # fmt: skip
        async with conn.transaction(isolation=isolation):  # type: ignore[arg-type]
            return await F.update_task(conn, ctx.a, child, state="cancelled", state_version=1)

    return step


def _late_parent(deadline: datetime) -> Step:
    """A child of a fresh parent of tenant a whose deadline is ``deadline``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        parent = await F.create_task(conn, ctx.a, deadline_at=deadline)
        return await F.create_task(conn, ctx.a, parent_id=parent, child_key="c1")

    return step


def _child_key(key: str) -> Callable[[Ctx], str]:
    """The dedupe key the child ``key`` of the context's task of tenant a has."""
    return lambda c: f"child/{c.task_a}/{key}"


def _keyed_child(key: str) -> Step:
    """The child ``key`` of the context's task of tenant a, with its own dedupe key."""
    return task(
        parent_id=lambda c: c.task_a, child_key=key, dedupe_key=_child_key(key), input_hash=H
    )


HOUR = datetime(2026, 1, 1, tzinfo=UTC)  # a past hour: the schedules' anchor
_SCHEDULE = uuid.UUID("00000000-0000-4000-8000-0000000000d1")  # one fixed schedule per test


def _schedule(**row: Any) -> Step:
    """A raw hourly schedule of tenant a from HOUR (``row`` overrides its columns)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        base = {"tenant_id": ctx.a, "name": f"s-{uuid.uuid4().hex[:8]}", "task_type": "report",
                "every": timedelta(hours=1), "anchor": HOUR, "next_tick_at": HOUR}  # fmt: skip
        return await F.insert(conn, "agent_schedules", {**base, **_resolve(ctx, row)})

    return step


def _ticked(offset: timedelta, *, of: str = "a", shared: bool = False) -> Step:
    """A task of tenant a for tick HOUR + ``offset`` of a fresh hourly schedule of tenant
    ``of`` - or, ``shared``, of the test's one schedule (made by the first step)."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        tenant = getattr(ctx, of)
        sid = _SCHEDULE if shared else uuid.uuid4()
        await conn.execute(
            "INSERT INTO agent_schedules (tenant_id, id, name, task_type, every, anchor,"
            " next_tick_at) VALUES ($1, $2, $3, 'report', interval '1 hour', $4, $4)"
            " ON CONFLICT DO NOTHING",
            tenant, sid, f"s-{sid}", HOUR,
        )  # fmt: skip
        return await F.create_task(conn, ctx.a, schedule_id=sid, schedule_tick=HOUR + offset)

    return step


def _retick(column: str) -> Step:
    """A task for tick HOUR of a fresh schedule, then a versioned write to ``column``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await _ticked(timedelta(0))(conn, ctx)
        value = HOUR + timedelta(hours=1) if column == "schedule_tick" else "step-2"
        return await F.update_task(conn, ctx.a, task_id, state_version=1, **{column: value})

    return step


_TENANT_A_ACTION = lambda c: f"g-{c.a}"  # noqa: E731 - one global action per test


def _step_row(
    *,
    task_state: str | None = None,
    deadline: datetime | None = None,
    claimed: bool = True,
    signals: int = 0,
    others: int = 0,
    on: str = "fresh",
    then: dict[str, Any] | None = None,
    **row: Any,
) -> Step:
    """A raw step (``row`` overrides its columns) of a fresh task of tenant a, claimed under
    lease token 1 (unless not ``claimed``), sent ``signals`` signals first (and tenant a's
    other task, ``ctx.task_a``, sent ``others``), or moved to
    ``task_state`` (after its claim is given back), given ``deadline``; ``on="b"`` aims it at
    tenant b's task while the row says tenant a. ``then``: an UPDATE of the step after it."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a, deadline_at=deadline)
        for _ in range(signals):
            await F.signal(conn, ctx.a, task_id)
        for _ in range(others):
            await F.signal(conn, ctx.a, ctx.task_a)
        if claimed:
            await F.claim_task(conn, ctx.a, task_id)
        if task_state:
            await F.update_task(
                conn, ctx.a, task_id, state=task_state, state_version=2, lease_owner=None,
                lease_acquired_at=None, lease_expires_at=None,
            )  # fmt: skip
        values = {
            "tenant_id": ctx.a,
            "task_id": task_id if on == "fresh" else ctx.task_b,
            "name": "plan",
            "kind": "step",
            "input_hash": H,
            "lease_token": 1,
            **_resolve(ctx, row),
        }
        name = await F.insert(conn, "agent_steps", values)
        if then:
            sets = ", ".join(f"{col} = ${i}" for i, col in enumerate(then, start=4))
            await conn.execute(
                f"UPDATE agent_steps SET {sets} WHERE tenant_id = $1 AND task_id = $2"  # noqa: S608
                " AND name = $3",
                ctx.a, task_id, name, *then.values(),
            )  # fmt: skip
        return name

    return step


def _two_steps(**second: Any) -> Step:
    """Two raw steps of one claimed task of tenant a: ``plan``, then one with ``second``."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a)
        await F.signal(conn, ctx.a, task_id)
        await F.claim_task(conn, ctx.a, task_id)
        base = {"tenant_id": ctx.a, "task_id": task_id, "input_hash": H, "lease_token": 1}
        await F.insert(
            conn, "agent_steps", {**base, "name": "wait-1", "kind": "signal", "signal_seq": 1}
        )
        return await F.insert(conn, "agent_steps", {**base, "name": "plan", "kind": "step",
                                                    **second})  # fmt: skip

    return step


def _message_for(task_state: str | None) -> Step:
    """An outbox message, enqueued raw, naming a fresh task of tenant a - open, or moved to
    ``task_state`` first."""

    async def step(conn: asyncpg.Connection, ctx: Ctx) -> Any:
        task_id = await F.create_task(conn, ctx.a)
        if task_state:
            await F.update_task(conn, ctx.a, task_id, state=task_state, state_version=1)
        return await F.insert(
            conn, "agent_outbox", {"tenant_id": ctx.a, "topic": "t", "task_id": task_id}
        )

    return step


CASES: list[Case] = [
    # ---- tenants, principals, transitions: owner-managed ------------------------------
    Case("agent_tenants_pkey", "23505", tenant(id=FIXED), tenant(id=FIXED), role="admin"),
    Case(
        "agent_tenants_state_valid",
        "23514",
        tenant(state="deleting"),
        tenant(state="gone"),
        role="admin",
    ),
    Case(
        "agent_tenants_name_key",
        "23505",
        tenant(name="acme"),
        tenant(name="acme"),
        role="admin",
        # On Citus the names are unique in agent_tenant_names (0013.operator;
        # tests/citus: test_G2_tenant_names_are_unique_on_citus_in_agent_tenant_names).
        citus=ABSENT,
    ),
    Case("agent_tenants_name_valid", "23514", tenant(name="acme"), tenant(name=""), role="admin"),
    Case(
        "agent_principals_pkey",
        "23505",
        principal(role_name="bot"),
        principal(role_name="bot"),
        role="admin",
    ),
    Case(
        "agent_principals_tenant_fkey",
        "23503",
        principal(),
        principal(tenant_id=uuid.uuid4()),
        role="admin",
        citus=ABSENT,
    ),
    Case(
        "agent_principals_role_name_valid",
        "23514",
        principal(),
        principal(role_name=""),
        role="admin",
    ),
    Case("agent_transitions_pkey", "23505", edge(), edge(), role="admin"),
    Case(
        "agent_transitions_pkey",
        "42501",
        sql("SELECT count(*) FROM agent_transitions"),
        edge(to_state="succeeded"),
        label="runtime-cannot-extend-graph",
        constraint="",
    ),
    Case("agent_transitions_entity_valid", "23514", edge(), edge(entity="job"), role="admin"),
    Case("agent_transitions_no_self_loop", "23514", edge(), edge(to_state="waiting"), role="admin"),
    # ---- tasks ------------------------------------------------------------------------
    Case("agent_tasks_pkey", "23505", task(id=FIXED), task(id=FIXED)),
    Case(
        "agent_tasks_tenant_fkey",
        "23503",
        task(),
        row("agent_tasks", lambda c: F.task_row(uuid.uuid4())),
    ),
    Case(
        "agent_tasks_dedupe_key",
        "23505",
        seq(task(dedupe_key="k1", input_hash=H), task(tenant="b", dedupe_key="k1", input_hash=H)),
        task(dedupe_key="k1", input_hash=H),
    ),
    Case(
        "agent_tasks_state_valid",
        "23514",
        raw_task(state="dead"),
        raw_task(state="archived"),
        role="replica",
    ),
    Case(
        "agent_tasks_state_version_valid",
        "23514",
        raw_task(state_version=3),
        raw_task(state_version=-1),
        role="replica",
    ),
    Case("agent_tasks_task_type_valid", "23514", task(task_type="t"), task(task_type="")),
    Case(
        "agent_tasks_workflow_version_valid",
        "23514",
        task(workflow_version="v2"),
        task(workflow_version=""),
    ),
    # The bounds themselves (the generated sample of issue 35: a bound moved by one
    # survived every case above it).
    Case(
        "agent_tasks_workflow_version_valid",
        "23514",
        task(workflow_version="v" * 100),
        task(workflow_version="v" * 101),
        label="at-the-limit",
    ),
    Case(
        "agent_tasks_current_step_valid", "23514", task(current_step="fetch"), task(current_step="")
    ),
    Case(
        "agent_tasks_due_has_wake_at",
        "23514",
        task(wake_at=datetime.max.replace(tzinfo=UTC)),
        task(wake_at=None),
    ),
    Case(
        "agent_tasks_attempts_valid",
        "23514",
        task(attempts=3, max_attempts=3),
        task(attempts=4, max_attempts=3),
    ),
    Case(
        "agent_tasks_attempts_valid",
        "23514",
        task(max_attempts=1),
        task(max_attempts=0),
        label="at-the-floor",
    ),
    Case("agent_tasks_last_error_valid", "23514", task(last_error="boom"), task(last_error=LONG)),
    Case(
        "agent_tasks_dedupe_has_hash",
        "23514",
        task(dedupe_key="k", input_hash=H),
        task(dedupe_key="k"),
    ),
    Case(
        "agent_tasks_dedupe_key_valid",
        "23514",
        task(dedupe_key="k", input_hash=H),
        task(dedupe_key="", input_hash=H),
    ),
    Case(
        "agent_tasks_input_hash_format",
        "23514",
        task(dedupe_key="k", input_hash=H),
        task(dedupe_key="k", input_hash=H.upper()),
    ),
    Case("agent_tasks_params_valid", "23514", task(params='{"n": 1}'), task(params="[1, 2]")),
    Case(
        "agent_tasks_params_valid",
        "23514",
        task(params='{"n": 1}'),
        task(params=BIG),
        label="too-large",
    ),
    # The bound itself: 65,536 bytes as jsonb prints them pass, one more is refused (a
    # generated mutant moving the bound by one survived the cases above).
    Case(
        "agent_tasks_params_valid",
        "23514",
        task(params=AT_LIMIT),
        task(params=OVER_LIMIT),
        label="at-the-limit",
    ),
    Case(
        "agent_tasks_lease_complete",
        "23514",
        task_change(state="running", lease_expires_at=NOW + timedelta(minutes=1), **LEASE),
        task_change(state="running", lease_expires_at=None, **LEASE),
    ),
    Case(
        "agent_tasks_lease_window",
        "23514",
        task_change(state="running", lease_expires_at=NOW + timedelta(seconds=1), **LEASE),
        task_change(state="running", lease_expires_at=NOW, **LEASE),
    ),
    Case(
        "agent_tasks_running_is_leased",
        "23514",
        task_change(state="running", lease_expires_at=NOW + timedelta(minutes=1), **LEASE),
        task_change(state="running"),
    ),
    Case(
        "agent_tasks_running_is_leased",
        "23514",
        raw_task(state="pending"),
        raw_task(state="pending", lease_expires_at=NOW + timedelta(minutes=1), **LEASE),
        role="replica",
        label="leased-means-running",
    ),
    Case(
        "agent_tasks_lease_owner_valid",
        "23514",
        task_change(state="running", lease_expires_at=NOW + timedelta(minutes=1), **LEASE),
        task_change(
            state="running",
            lease_expires_at=NOW + timedelta(minutes=1),
            **{**LEASE, "lease_owner": ""},
        ),
    ),
    Case("agent_tasks_lease_token_valid", "23514", task(lease_token=0), task(lease_token=-1)),
    Case(
        "agent_tasks_lease_ttl_valid",
        "23514",
        task(lease_ttl=timedelta(hours=2)),
        task(lease_ttl=timedelta(0)),
    ),
    # The bounds themselves are allowed, a microsecond past them is not (kills the
    # generated gen-0002.tasks-agent_tasks_lease_ttl_valid-cmp-* class: a bound's
    # comparison made strict).
    Case(
        "agent_tasks_lease_ttl_valid",
        "23514",
        task(lease_ttl=timedelta(days=1)),
        task(lease_ttl=timedelta(days=1, microseconds=1)),
        label="at-the-limit",
    ),
    Case(
        "agent_tasks_lease_ttl_valid",
        "23514",
        task(lease_ttl=timedelta(seconds=1)),
        task(lease_ttl=timedelta(microseconds=999_999)),
        label="at-the-floor",
    ),
    Case("agent_tasks_trace_id_format", "23514", task(trace_id=F.TRACE), task(trace_id="0" * 32)),
    Case(
        "agent_tasks_trace_id_format",
        "23514",
        task(trace_id=F.TRACE),
        task(trace_id="not-hex"),
        label="not-hex",
    ),
    Case("agent_tasks_span_id_format", "23514", task(span_id=F.SPAN), task(span_id=F.SPAN.upper())),
    # W3C's invalid all-zero span id is well-formed hex: only its own conjunct refuses it
    # (kills the generated gen-0002.tasks-agent_tasks_span_id_format-and-2).
    Case(
        "agent_tasks_span_id_format",
        "23514",
        task(span_id=F.SPAN),
        task(span_id="0" * 16),
        label="all-zero",
    ),
    Case(
        "agent_tasks_transition_guard",
        "AG001",
        task_change(
            claim=True,
            state="succeeded",
            lease_owner=None,
            lease_acquired_at=None,
            lease_expires_at=None,
        ),
        task_change(state="succeeded"),
    ),
    Case(
        "agent_tasks_transition_guard",
        "AG001",
        task(state="waiting"),
        task(state="succeeded"),
        label="born-finished",
    ),
    Case(
        "agent_tasks_transition_guard",
        "AG001",
        _finish_task,
        seq(_finish_task, _reopen_last_task),
        label="finished-is-final",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG002",
        task_change(current_step="a"),
        task_change(current_step="a", state_version=2),
        label="skip-a-version",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG002",
        task_change(current_step="a"),
        task_change(current_step="a", state_version=0),
        label="write-without-bump",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG002",
        task(state_version=0),
        task(state_version=7),
        label="born-late",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG002",
        _heartbeat,
        task_change(
            claim=True,
            state_version=1,
            lease_expires_at=NOW + timedelta(hours=1),
            current_step="sneaky",
        ),
        label="heartbeat-smuggles-a-write",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG004",
        task_change(current_step="a"),
        task_change(tenant_id=lambda c: c.b),
        label="tenant-is-immutable",
        citus=PARTITION_COLUMN,
    ),
    Case(
        "agent_tasks_version_guard",
        "AG005",
        _regrant_new_token,
        _regrant_same_token,
        label="regrant-needs-new-token",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG005",
        _regrant_new_token,
        _token_backwards,
        label="token-never-goes-back",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG005",
        _regrant_new_token,
        _reacquire_same_token,
        label="reacquire-needs-new-token",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG005",
        _regrant_new_token,
        _reclaim_after_release_same_token,
        label="reclaim-after-release-needs-new-token",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG004",
        task_change(current_step="a"),
        task_change(created_at=PAST),
        label="created-at-is-immutable",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG004",
        task_change(current_step="a"),
        task_change(id=lambda c: uuid.uuid4()),
        label="id-is-immutable",
    ),
    # G4: what a key was issued for stays bound to it (AG008).
    Case(
        "agent_tasks_version_guard",
        "AG008",
        keyed_task_change(current_step="a"),
        keyed_task_change(input_hash=H2),
        label="input-hash-is-bound-to-the-key",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG008",
        keyed_task_change(current_step="a"),
        keyed_task_change(dedupe_key="another-request"),
        label="dedupe-key-is-bound",
    ),
    Case(
        "agent_tasks_version_guard",
        "AG008",
        keyed_task_change(current_step="a"),
        keyed_task_change(task_type="another.type"),
        label="task-type-is-bound",
    ),
    Case(
        "agent_tasks_event_required",
        "AG006",
        task_change(current_step="a"),
        _state_change_without_event,
        citus=FAILED_COMMIT,
    ),
    # ---- operations -------------------------------------------------------------------
    Case("agent_operations_pkey", "23505", op(id=FIXED), op(id=FIXED)),
    # G2: the article's attack - an operation of tenant b pointing at tenant a's task.
    Case(
        "agent_operations_task_fkey",
        "23503",
        op(tenant="b"),
        op(tenant="b", task_id=lambda c: c.task_a),
    ),
    Case(
        "agent_operations_idempotency_key",
        "23505",
        seq(op(idempotency_key="charge-1"), op(tenant="b", idempotency_key="charge-1")),
        # Another action under the same key: the key alone (per tenant) must be unique.
        op(idempotency_key="charge-1", action="refund"),
    ),
    Case(
        "agent_operations_state_valid",
        "23514",
        raw_op(state="unknown"),
        raw_op(state="maybe"),
        role="replica",
    ),
    Case(
        "agent_operations_state_version_valid",
        "23514",
        raw_op(state_version=2),
        raw_op(state_version=-1),
        role="replica",
    ),
    Case(
        "agent_operations_idempotency_key_valid",
        "23514",
        op(idempotency_key="k"),
        op(idempotency_key=""),
    ),
    Case("agent_operations_action_valid", "23514", op(action="a"), op(action="")),
    Case("agent_operations_input_hash_format", "23514", op(input_hash=H), op(input_hash="abc")),
    Case("agent_operations_attempts_valid", "23514", op(attempts=2), op(attempts=0)),
    Case(
        "agent_operations_provider_reference_valid",
        "23514",
        op(provider_reference="ch_1"),
        op(provider_reference=""),
    ),
    Case("agent_operations_error_valid", "23514", op(error="timeout"), op(error=LONG)),
    Case(
        "agent_operations_succeeded_has_no_error",
        "23514",
        op_change({"state": "failed", "error": "card declined"}),
        op_change({"state": "succeeded", "error": "but also failed"}),
    ),
    Case("agent_operations_result_valid", "23514", op(result='{"id": "ch_1"}'), op(result=BIG)),
    Case("agent_operations_trace_id_format", "23514", op(trace_id=F.TRACE), op(trace_id="abc")),
    Case("agent_operations_span_id_format", "23514", op(span_id=F.SPAN), op(span_id="0" * 16)),
    Case(
        "agent_operations_transition_guard",
        "AG001",
        op_change({"state": "in_flight"}, {"state": "unknown"}, {"state": "succeeded"}),
        op_change({"state": "succeeded"}, {"state": "in_flight"}),
    ),
    Case(
        "agent_operations_transition_guard",
        "AG001",
        op(state="reserved"),
        op(state="succeeded"),
        label="born-finished",
    ),
    Case(
        "agent_operations_version_guard",
        "AG002",
        op_change({"state": "in_flight"}),
        op_change({"state": "in_flight", "state_version": 3}),
    ),
    Case(
        "agent_operations_version_guard",
        "AG004",
        op_change({"state": "in_flight"}),
        op_change({"tenant_id": lambda c: c.b}),
        label="tenant-is-immutable",
        citus=PARTITION_COLUMN,
    ),
    Case(
        "agent_operations_version_guard",
        "AG004",
        op_change({"state": "in_flight"}),
        op_change({"created_at": PAST}),
        label="created-at-is-immutable",
    ),
    Case(
        "agent_operations_version_guard",
        "AG008",
        op_change({"state": "in_flight"}),
        op_change({"input_hash": H2}),
        label="input-hash-is-bound-to-the-key",
    ),
    Case(
        "agent_operations_version_guard",
        "AG008",
        op_change({"state": "in_flight"}),
        op_change({"action": "refund"}),
        label="action-is-bound",
    ),
    Case(
        "agent_operations_version_guard",
        "AG008",
        op_change({"state": "in_flight"}),
        op_change({"idempotency_key": "another-key"}),
        label="idempotency-key-is-bound",
    ),
    Case(
        "agent_operations_version_guard",
        "AG008",
        op_change({"state": "in_flight"}),
        _op_moves_to_another_task,
        label="task-is-bound",
    ),
    Case(
        "agent_operations_event_required",
        "AG006",
        op_change({"state": "in_flight"}),
        _op_change_without_event,
        citus=FAILED_COMMIT,
    ),
    # ---- events -----------------------------------------------------------------------
    # With created_at: by month (opt-in) the key holds it.
    Case(
        "agent_events_pkey", "23505", ev(id=10**12, created_at=NOW), ev(id=10**12, created_at=NOW)
    ),
    Case("agent_events_task_fkey", "23503", ev(), ev(tenant_id=lambda c: c.b)),
    Case(
        "agent_events_operation_fkey",
        "23503",
        ev(operation_id=lambda c: c.op_a),
        ev(operation_id=lambda c: c.op_b),
    ),
    Case("agent_events_event_type_valid", "23514", ev(event_type="x"), ev(event_type="")),
    Case("agent_events_actor_id_valid", "23514", ev(actor_id="x"), ev(actor_id="")),
    Case(
        "agent_events_policy_version_valid", "23514", ev(policy_version="x"), ev(policy_version="")
    ),
    Case("agent_events_state_valid", "23514", ev(from_state="pending"), ev(from_state="s" * 51)),
    Case(
        "agent_events_operation_version_has_operation",
        "23514",
        ev(operation_id=lambda c: c.op_a, operation_state_version=None),
        ev(operation_state_version=7),
    ),
    Case("agent_events_payload_size", "23514", ev(payload='{"ok": true}'), ev(payload=BIG_EVENT)),
    Case(
        "agent_events_payload_size",
        "23514",
        ev(payload='{"ok": true}'),
        ev(payload='"text"'),
        label="not-an-object",
    ),
    Case(
        "agent_events_payload_no_secrets",
        "23514",
        ev(payload='{"tokens_used": 512, "password": "[redacted]"}'),
        ev(payload='{"request": {"headers": [{"Authorization": "x"}]}}'),
        label="secret-key",
    ),
    Case(
        "agent_events_payload_no_secrets",
        "23514",
        ev(payload='{"model": "gpt-x"}'),
        ev(payload='{"note": "used sk-abcdefghijklmnopqrstuvwx"}'),
        label="secret-value",
    ),
    *(
        Case(
            "agent_events_payload_no_secrets",
            "23514",
            ev(payload='{"tokens_used": 512, "model": "m"}'),
            ev(payload=json.dumps(secret)),
            label=f"secret-{label}",
        )
        for label, secret in (
            ("password-key", {"db": {"password": "hunter2"}}),
            ("api-key", {"headers": {"x-api-key": "abc"}}),
            ("session-token-key", {"session_token": "abc"}),
            ("access-token-key", {"cost": {"tokens": 10}, "oauth": {"Access-Token": "abc"}}),
            ("refresh-token-key", {"cost": {"tokens": 10}, "refresh_token": "abc"}),
            ("id-token-key", {"cost": {"tokens": 10}, "oidc": {"id_token": "abc"}}),
            ("auth-token-key", {"cost": {"tokens": 10}, "AUTHTOKEN": "abc"}),
            ("cookie-key", {"cookie": "sid=1"}),
            ("pem", {"note": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow"}),
            ("bearer", {"note": "Authorization was Bearer abcdefgh12345678"}),
            ("aws", {"note": "key AKIAABCDEFGHIJKLMNOP"}),
            ("github", {"note": "ghp_" + "a" * 36}),
            ("slack", {"note": "xoxb-1234567890-abc"}),
            ("jwt", {"note": "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.sig"}),
        )
    ),
    Case(
        "agent_events_retention_order",
        "23514",
        ev(payload_expires_at=NOW, retain_until=NOW),
        ev(payload_expires_at=NOW + timedelta(days=2), retain_until=NOW),
    ),
    Case("agent_events_trace_id_format", "23514", ev(trace_id=F.TRACE), ev(trace_id="xyz")),
    Case("agent_events_span_id_format", "23514", ev(span_id=F.SPAN), ev(span_id="xyz")),
    Case(
        "agent_events_task_version_key",
        "23505",
        ev(task_state_version=None),
        ev(task_state_version=0),
    ),
    Case(
        "agent_events_operation_version_key",
        "23505",
        ev(operation_id=lambda c: c.op_a, operation_state_version=None),
        ev(operation_id=lambda c: c.op_a, operation_state_version=0),
    ),
    Case(
        "agent_events_append_only",
        "AG003",
        _erase_payload,
        _rewrite_event,
        role="admin",
        label="update-refused",
    ),
    Case(
        "agent_events_append_only",
        "AG003",
        _erase_payload,
        _erase_and_rewrite,
        role="admin",
        label="erasure-cannot-smuggle",
    ),
    Case(
        "agent_events_append_only",
        "AG003",
        _erase_payload,
        _rewrite_payload,
        role="admin",
        label="payload-is-erased-never-rewritten",
    ),
    Case(
        "agent_events_append_only",
        "AG003",
        _delete_expired_event,
        _delete_retained_event,
        role="admin",
        label="delete-before-retention",
    ),
    Case(
        "agent_events_append_only",
        "AG003",
        _delete_event_retained_until(timedelta(0)),
        _delete_event_retained_until(timedelta(microseconds=1)),
        role="admin",
        label="delete-at-retention-edge",
    ),
    Case(
        "agent_events_append_only",
        "42501",
        _runtime_appends_event,
        _runtime_rewrites_event,
        label="runtime-has-no-update",
        constraint="",
    ),
    Case(
        "agent_events_append_only",
        "42501",
        _runtime_appends_event,
        _runtime_deletes_event,
        label="runtime-has-no-delete",
        constraint="",
    ),
    Case(
        "agent_events_no_truncate",
        "AG003",
        _count_events,
        sql("TRUNCATE agent_events CASCADE"),
        role="admin",
    ),
    # ---- outbox and inbox -------------------------------------------------------------
    Case("agent_outbox_pkey", "23505", outbox(id=FIXED), outbox(id=FIXED)),
    Case("agent_outbox_tenant_fkey", "23503", outbox(), outbox(tenant_id=uuid.uuid4())),
    Case(
        "agent_outbox_task_fkey",
        "23503",
        outbox(task_id=lambda c: c.task_a),
        outbox(task_id=lambda c: c.task_b),
    ),
    Case(
        "agent_outbox_state_valid",
        "23514",
        outbox(state="dead"),
        outbox(state="lost"),
        role="replica",
    ),
    Case("agent_outbox_topic_valid", "23514", outbox(topic="t"), outbox(topic="")),
    Case("agent_outbox_attempts_valid", "23514", outbox(attempts=0), outbox(attempts=-1)),
    Case(
        "agent_outbox_delivered_at_valid",
        "23514",
        outbox_change({"state": "delivered", "delivered_at": NOW}),
        outbox_change({"state": "delivered"}),
    ),
    Case(
        "agent_outbox_delivered_at_valid",
        "23514",
        outbox(state="pending"),
        outbox(state="pending", delivered_at=NOW),
        role="replica",
        label="pending-has-no-delivery-time",
    ),
    Case(
        "agent_outbox_lease_owner_valid",
        "23514",
        outbox(lease_owner="relay-1"),
        outbox(lease_owner=""),
    ),
    Case("agent_outbox_lease_token_valid", "23514", outbox(lease_token=3), outbox(lease_token=-3)),
    Case(
        "agent_outbox_last_error_valid", "23514", outbox(last_error="503"), outbox(last_error=LONG)
    ),
    Case("agent_outbox_payload_size", "23514", outbox(payload='{"a": 1}'), outbox(payload=BIG)),
    Case("agent_outbox_trace_id_format", "23514", outbox(trace_id=F.TRACE), outbox(trace_id="1")),
    Case("agent_outbox_span_id_format", "23514", outbox(span_id=F.SPAN), outbox(span_id="1")),
    Case(
        "agent_outbox_transition_guard",
        "AG001",
        outbox_change({"state": "dead"}, {"state": "pending"}),
        outbox_change(
            {"state": "delivered", "delivered_at": NOW}, {"state": "pending", "delivered_at": None}
        ),
    ),
    Case("agent_inbox_pkey", "23505", inbox(message_id=FIXED), inbox(message_id=FIXED)),
    Case("agent_inbox_tenant_fkey", "23503", inbox(), inbox(tenant_id=uuid.uuid4())),
    Case("agent_inbox_consumer_valid", "23514", inbox(consumer="c"), inbox(consumer="")),
    # ---- GenAI semantic-conventions pins (owner-managed, append-only) -----------------
    Case("agent_semconv_pins_pkey", "23505", pin(since=NOW), pin(since=NOW), role="admin"),
    Case(
        "agent_semconv_pins_version_format",
        "23514",
        pin(version="1.37.0-dev"),
        pin(version="latest"),
        role="admin",
    ),
    Case("agent_semconv_pins_append_only", "AG003", pin(), _repin, role="admin"),
    # ---- artifacts and credential references ------------------------------------------
    Case("agent_artifacts_pkey", "23505", artifact(id=FIXED), artifact(id=FIXED)),
    Case("agent_artifacts_tenant_fkey", "23503", artifact(), artifact(tenant_id=uuid.uuid4())),
    Case(
        "agent_artifacts_task_fkey",
        "23503",
        artifact(task_id=lambda c: c.task_a),
        artifact(task_id=lambda c: c.task_b),
    ),
    Case(
        "agent_artifacts_operation_fkey",
        "23503",
        artifact(operation_id=lambda c: c.op_a),
        artifact(operation_id=lambda c: c.op_b),
    ),
    Case("agent_artifacts_kind_valid", "23514", artifact(kind="k"), artifact(kind="")),
    Case(
        "agent_artifacts_uri_valid", "23514", artifact(uri="gs://b/o"), artifact(uri="/etc/passwd")
    ),
    Case("agent_artifacts_sha256_format", "23514", artifact(sha256=H), artifact(sha256="12")),
    Case("agent_artifacts_size_valid", "23514", artifact(size_bytes=0), artifact(size_bytes=-1)),
    Case(
        "agent_artifacts_content_type_valid",
        "23514",
        artifact(content_type="text/plain"),
        artifact(content_type=""),
    ),
    Case(
        "agent_artifacts_content_type_valid",
        "23514",
        artifact(content_type="x"),
        artifact(content_type="x" * 201),
        label="at-the-bounds",
    ),
    # Credential references are managed by the owner; the runtime may only read them.
    Case("agent_credential_refs_pkey", "23505", cred(id=FIXED), cred(id=FIXED), role="admin"),
    Case(
        "agent_credential_refs_name_key",
        "23505",
        cred(name="openai"),
        cred(name="openai"),
        role="admin",
    ),
    Case(
        "agent_credential_refs_tenant_fkey",
        "23503",
        cred(),
        cred(tenant_id=uuid.uuid4()),
        role="admin",
    ),
    Case("agent_credential_refs_name_valid", "23514", cred(name="n"), cred(name=""), role="admin"),
    Case(
        "agent_credential_refs_provider_valid",
        "23514",
        cred(provider="p"),
        cred(provider=""),
        role="admin",
    ),
    Case(
        "agent_credential_refs_is_reference",
        "23514",
        cred(secret_ref="env://OPENAI_API_KEY"),
        cred(secret_ref="sk-live-abcdefghijklmnopqrstuvwxyz"),
        role="admin",
        label="raw-secret",
    ),
    Case(
        "agent_credential_refs_is_reference",
        "23514",
        cred(secret_ref="aws-sm://prod/openai"),
        cred(secret_ref="vault://x?token=sk-abcdefghijklmnopqrstuvwx"),
        role="admin",
        label="secret-in-uri",
    ),
    Case(
        "agent_credential_refs_runtime_all",
        "42501",
        sql("SELECT count(*) FROM agent_credential_refs"),
        cred(),
        label="runtime-cannot-write-credentials",
        constraint="",
    ),
    # ---- concurrency caps (G18) ---------------------------------------------------------
    Case(
        "agent_concurrency_limits_pkey",
        "23505",
        cap(task_type="llm"),
        seq(cap(task_type="email"), cap(task_type="email")),
    ),
    Case("agent_concurrency_limits_tenant_fkey", "23503", cap(), cap(tenant_id=uuid.uuid4())),
    Case(
        "agent_concurrency_limits_max_running_valid",
        "23514",
        cap(max_running=0),
        cap(max_running=-1),
    ),
    Case("agent_concurrency_limits_task_type_valid", "23514", cap(), cap(task_type="")),
    Case(
        "agent_tasks_concurrency_guard",
        "AG009",
        seq(set_cap(max_running=2), _start_task, _start_task),
        seq(set_cap(max_running=1), _start_task, _start_task),
        label="tenant-cap",
    ),
    Case(
        "agent_tasks_concurrency_guard",
        "AG009",
        seq(
            set_cap(task_type="summarise", max_running=1),
            set_cap(task_type="other", max_running=0),
            _start_task,
        ),
        seq(set_cap(task_type="summarise", max_running=1), _start_task, _start_task),
        label="type-cap",
    ),
    Case(
        "agent_tasks_concurrency_guard",
        "AG009",
        seq(set_cap(max_running=None), _start_task, _start_task),
        seq(set_cap(max_running=0), _start_task),
        label="paused",
    ),
    # ---- budgets and rate limits (G19) ----------------------------------------------------
    Case(
        "agent_budgets_pkey",
        "23505",
        budget(id=_BUDGET),
        seq(budget(id=uuid.UUID(int=7)), budget(id=uuid.UUID(int=7))),
    ),
    Case(
        "agent_budgets_scope_key",
        "23505",
        seq(budget(unit="same"), budget(unit="same", task_id=lambda c: c.task_a)),
        seq(budget(unit="dupe"), budget(unit="dupe")),
        label="tenant-budget-twice",
    ),
    Case("agent_budgets_tenant_fkey", "23503", budget(), budget(tenant_id=uuid.uuid4())),
    Case(
        "agent_budgets_task_fkey",
        "23503",
        budget(task_id=lambda c: c.task_a),
        budget(task_id=lambda c: c.task_b),
        label="another-tenants-task",
    ),
    Case("agent_budgets_unit_valid", "23514", budget(unit="usd_micros"), budget(unit="Tokens!")),
    Case("agent_budgets_period_valid", "23514", budget(period="month"), budget(period="week")),
    Case(
        "agent_budgets_amounts_valid",
        "23514",
        budget(limit_amount=0),
        budget(limit_amount=10, held=-1),
    ),
    # Each amount on its own (kills gen-0009.budgets-agent_budgets_amounts_valid-int-4).
    Case(
        "agent_budgets_amounts_valid",
        "23514",
        budget(limit_amount=0),
        budget(limit_amount=10, spent=-1),
        label="spent",
    ),
    Case(
        "agent_budgets_within_limit",
        "23514",
        budget(limit_amount=10, spent=4, held=6),
        budget(limit_amount=10, spent=4, held=7),
        label="overspend-on-insert",
    ),
    Case(
        "agent_budgets_within_limit",
        "23514",
        budget_change({"limit_amount": 10, "held": 5}, held=10),
        budget_change({"limit_amount": 10, "held": 5}, limit_amount=4),
        label="limit-lowered-below-the-books",
    ),
    Case(
        "agent_budgets_guard",
        "AG010",
        budget_change({"spent": 5}, spent=6),
        budget_change({"spent": 5}, spent=0),
        label="refund-inside-the-window",
    ),
    Case(
        "agent_budgets_guard",
        "AG010",
        budget_change({}, limit_amount=50),
        budget_change({}, unit="other"),
        label="unit-rebound",
    ),
    Case(
        "agent_budgets_guard",
        "AG010",
        budget_change({}, period="day"),
        # One unit spent is enough (gen-0009.budgets-agentdb_guard_budget-int-1: `spent > 1`).
        budget_change({"spent": 1}, period="day"),
        label="period-switch-refunds",
    ),
    Case(
        "agent_budgets_guard",
        "AG010",
        budget_change({}, period="day"),
        budget_change({"held": 1}, period="day"),
        label="period-switch-releases",
    ),
    Case("agent_budget_holds_pkey", "23505", hold(), seq(hold(attempt=3), hold(attempt=3))),
    Case(
        "agent_budget_holds_operation_fkey",
        "23503",
        hold(),
        hold(operation_id=lambda c: c.op_b),
        label="another-tenants-operation",
    ),
    Case("agent_budget_holds_budget_fkey", "23503", hold(), hold(budget_id=uuid.uuid4())),
    Case("agent_budget_holds_amount_valid", "23514", hold(amount=0), hold(amount=-1)),
    Case("agent_budget_holds_state_valid", "23514", hold(state="released"), hold(state="spent")),
    Case(
        "agent_budget_holds_settled_valid",
        "23514",
        hold(state="settled", settled=5),
        hold(state="settled", settled=6),
        label="spent-more-than-held",
    ),
    Case(
        "agent_budget_holds_settled_valid",
        "23514",
        hold(state="held"),
        hold(state="held", settled=1),
        label="held-with-a-spend",
    ),
    Case(
        "agent_budget_holds_settled_valid",
        "23514",
        hold(state="settled", settled=0),
        hold(state="settled", settled=-1),
        label="settled-below-zero",
    ),
    Case(
        "agent_budget_holds_guard",
        "AG010",
        hold_change({}, state="settled", settled=2),
        hold_change({"state": "released"}, state="held"),
        label="released-hold-re-held",
    ),
    Case(
        "agent_budget_holds_guard",
        "AG010",
        hold_change({}, state="released"),
        hold_change({}, amount=1),
        label="hold-shrunk",
    ),
    Case("agent_rate_limits_pkey", "23505", rate(), seq(rate(action="x"), rate(action="x"))),
    Case("agent_rate_limits_tenant_fkey", "23503", rate(), rate(tenant_id=uuid.uuid4())),
    Case("agent_rate_limits_action_valid", "23514", rate(action="a"), rate(action="")),
    Case(
        "agent_rate_limits_per_valid",
        "23514",
        rate(per=timedelta(days=30)),
        rate(per=timedelta(0)),
    ),
    Case("agent_rate_limits_used_valid", "23514", rate(max_calls=0), rate(used=-1)),
    Case(
        "agent_rate_limits_within_limit",
        "23514",
        rate(max_calls=2, used=2),
        rate(max_calls=2, used=3),
    ),
    Case(
        "agent_global_rate_limits_pkey",
        "23505",
        global_rate(),
        seq(global_rate(action=_TENANT_A_ACTION), global_rate(action=_TENANT_A_ACTION)),
        citus=NO_GLOBAL_LIMITS,
    ),
    Case(
        "agent_global_rate_limits_action_valid",
        "23514",
        global_rate(),
        global_rate(action=""),
        citus=NO_GLOBAL_LIMITS,
    ),
    Case(
        "agent_global_rate_limits_per_valid",
        "23514",
        global_rate(per=timedelta(hours=1)),
        global_rate(per=timedelta(days=-1)),
        citus=NO_GLOBAL_LIMITS,
    ),
    Case(
        "agent_global_rate_limits_used_valid",
        "23514",
        global_rate(used=0),
        global_rate(max_calls=-1),
        citus=NO_GLOBAL_LIMITS,
    ),
    Case(
        "agent_global_rate_limits_within_limit",
        "23514",
        global_rate(max_calls=1, used=1),
        global_rate(max_calls=1, used=2),
        citus=NO_GLOBAL_LIMITS,
    ),
    Case("agent_operations_rate_limit", "AG011", _calls(3, 3), _calls(3, 4)),
    Case("agent_operations_rate_limit", "AG011", _calls(1, 0), _calls(0, 1), label="paused"),
    Case(
        "agent_operations_rate_limit_retry",
        "AG011",
        _calls(3, 2, retry=True),
        _calls(3, 3, retry=True),
    ),
    # ---- G20: nothing is reserved for a finished task ----------------------------------
    Case("agent_operations_for_open_task", "AG012", _for_task(None), _for_task("cancelled")),
    Case(
        "agent_operations_for_open_task",
        "AG012",
        _for_task(None),
        _for_task("dead"),
        label="dead",
    ),
    # Every final state, not only those an operator reaches (kills
    # gen-0006.control_flow-agentdb_guard_open_task-list-1 and -list-2).
    Case(
        "agent_operations_for_open_task",
        "AG012",
        _for_task(None),
        _for_task("succeeded"),
        label="succeeded",
    ),
    Case(
        "agent_operations_for_open_task",
        "AG012",
        _for_task(None),
        _for_task("failed"),
        label="failed",
    ),
    Case(
        "agent_operations_for_open_task_retry",
        "AG012",
        _for_task(None, retry=True),
        _for_task("cancelled", retry=True),
    ),
    # ---- G21: past its deadline a task only ends -----------------------------------------
    Case("agent_tasks_deadline_guard", "AG013", _late("to_dead"), _late("claim"), label="claim"),
    Case(
        "agent_tasks_deadline_guard",
        "AG013",
        _late("finish_dead"),
        _late("finish"),
        label="finish",
    ),
    Case(
        "agent_tasks_deadline_guard",
        "AG013",
        _late("extend_open"),
        _late("extend"),
        label="extend",
    ),
    Case(
        "agent_tasks_deadline_guard",
        "AG013",
        _late("to_cancelled"),
        _late("claim"),
        label="cancel",
    ),
    Case(
        "agent_tasks_deadline_guard",
        "AG013",
        _late("retry_open"),
        _late("retry"),
        label="retry",
    ),
    Case(
        "agent_operations_for_open_task",
        "AG013",
        _for_task(None, deadline=FUTURE),
        _for_task(None, deadline=PAST),
        label="deadline",
    ),
    Case(
        "agent_operations_for_open_task_retry",
        "AG013",
        _for_task(None, retry=True, deadline=FUTURE),
        _for_task(None, retry=True, deadline=FUTURE, passed_after=True),
        label="deadline",
    ),
    # ---- G22: signals arrive once, in order; no agent approves its own work ---------------
    Case("agent_signals_guard", "AG012", _sig(), _sig(task_state="cancelled")),
    Case("agent_signals_guard", "AG013", _sig(deadline=FUTURE), _sig(deadline=PAST)),
    Case(
        "agent_signals_guard",
        "AG014",
        _sig(held_by="worker-1", kind="approval", decision="approved", sender="reviewer"),
        _sig(held_by="worker-1", kind="approval", decision="approved", sender="worker-1"),
    ),
    Case(
        "agent_signals_guard",
        "AG014",
        # Only an approval is judged by who sends it: a holder may signal its own task
        # (kills gen-0006.control_flow-agentdb_guard_signal-and-2, the kind test dropped).
        _sig(held_by="worker-1", kind="signal", sender="worker-1"),
        _sig(held_by="worker-1", kind="approval", decision="approved", sender="worker-1"),
        label="holder-may-signal",
    ),
    Case("agent_signals_immutable", "AG003", _sig(), _signal_changed(), role="admin"),
    Case("agent_tasks_signal_guard", "AG014", _cursor((1,)), _cursor((1, 0)), label="back"),
    Case("agent_tasks_signal_guard", "AG014", _cursor((1,)), _cursor((2,)), label="past"),
    # Another task's signal 2 is not this task's (gen-0006.control_flow-agentdb_guard_signal_
    # cursor-and-3: the signal looked for in every task of the tenant).
    Case(
        "agent_tasks_signal_guard",
        "AG014",
        _cursor((1,), sibling_signals=2),
        _cursor((2,), sibling_signals=2),
        label="past-to-another-task-s-signal",
    ),
    Case(
        "agent_signals_seq_key",
        "23505",
        _sig(on="a", seq=1, name="first"),
        _sig(on="a", seq=1, name="second"),
        role="replica",
    ),
    Case(
        "agent_signals_dedupe_key",
        "23505",
        _sig(on="a", dedupe_key="k1", input_hash=H),
        _sig(on="a", dedupe_key="k1", input_hash=H),
    ),
    Case("agent_signals_pkey", "23505", _sig(on="a", id=_SIGNAL), _sig(on="a", id=_SIGNAL)),
    Case("agent_signals_task_fkey", "23503", _sig(), _sig(on="b")),
    Case(
        "agent_signals_tenant_fkey",
        "23503",
        _sig(on="a"),
        _sig(on="a", tenant_id=lambda c: uuid.uuid4()),
        role="admin",
        # On a worker the task's foreign key is checked first: both name no row there.
        citus="23503",
    ),
    Case(
        "agent_signals_seq_valid", "23514", _sig(on="a", seq=1), _sig(on="a", seq=0), role="replica"
    ),
    Case("agent_signals_name_valid", "23514", _sig(name="go"), _sig(name="")),
    Case("agent_signals_kind_valid", "23514", _sig(kind="signal"), _sig(kind="nudge")),
    Case(
        "agent_signals_decision_valid",
        "23514",
        _sig(kind="approval", decision="rejected", sender="reviewer"),
        _sig(kind="approval", sender="reviewer"),
    ),
    Case(
        "agent_signals_decision_valid",
        "23514",
        _sig(kind="approval", decision="approved", sender="reviewer"),
        _sig(kind="approval", decision="maybe", sender="reviewer"),
        label="unknown",
    ),
    Case("agent_signals_sender_valid", "23514", _sig(sender="ops"), _sig(sender="")),
    Case(
        "agent_signals_dedupe_has_hash",
        "23514",
        _sig(dedupe_key="k", input_hash=H),
        _sig(dedupe_key="k"),
    ),
    Case(
        "agent_signals_dedupe_key_valid",
        "23514",
        _sig(dedupe_key="k", input_hash=H),
        _sig(dedupe_key="", input_hash=H),
    ),
    # The bound itself is allowed
    # (kills gen-0006.control_flow-agent_signals_dedupe_key_valid-int-4).
    Case(
        "agent_signals_dedupe_key_valid",
        "23514",
        _sig(dedupe_key="k" * 255, input_hash=H),
        _sig(dedupe_key="k" * 256, input_hash=H),
        label="at-the-limit",
    ),
    Case(
        "agent_signals_input_hash_format",
        "23514",
        _sig(dedupe_key="k", input_hash=H),
        _sig(dedupe_key="k", input_hash="nothex"),
    ),
    Case("agent_signals_payload_valid", "23514", _sig(payload='{"n": 1}'), _sig(payload=BIG)),
    Case(
        "agent_signals_payload_valid",
        "23514",
        _sig(payload='{"n": 1}'),
        _sig(payload="[1]"),
        label="not-an-object",
    ),
    Case(
        "agent_tasks_wait_signal_valid",
        "23514",
        task(state="waiting", wait_signal="approval"),
        task(state="waiting", wait_signal=""),
    ),
    Case(
        "agent_tasks_signal_cursor_valid",
        "23514",
        raw_task(signal_cursor=0),
        raw_task(signal_cursor=-1),
        role="replica",
    ),
    Case("agent_signals_guard", "AG015", _sig_at(RC), _sig_at(RR), label="isolation"),
    # Postgres runs READ UNCOMMITTED as READ COMMITTED: taken as it is (kills generated
    # gen-0006.control_flow-agentdb_require_read_committed-list-2, which refused it).
    Case(
        "agent_signals_guard",
        "AG015",
        _sig_at("read_uncommitted"),
        _sig_at(RR),
        label="isolation-read-uncommitted",
    ),
    Case(
        "agent_tasks_signal_guard",
        "AG015",
        _wait_at(RC, on="signal"),
        _wait_at(RR, on="signal"),
        label="isolation",
    ),
    # ---- G23: children in their parent's tenant, once per key --------------------------
    Case("agent_tasks_child_guard", "AG012", _child(), _child(parent_state="cancelled")),
    Case(
        "agent_tasks_child_guard",
        "AG013",
        _late_parent(FUTURE),
        _late_parent(PAST),
        label="deadline",
    ),
    Case("agent_tasks_fan_in", "AG016", _fan_in_at(RC), _fan_in_at(RR)),
    Case(
        "agent_tasks_children_guard",
        "AG016",
        _wait_at(RC, on="children"),
        _wait_at(RR, on="children"),
    ),
    # An end at RR is no wait: only a wait needs READ COMMITTED.
    Case(
        "agent_tasks_children_guard",
        "AG016",
        _parent_ended_at(RR),
        _wait_at(RR, on="children"),
        label="ended",
    ),
    Case(
        "agent_tasks_child_dedupe_reserved",
        "23514",
        _keyed_child("k1"),
        task(dedupe_key=_child_key("k1"), input_hash=H),
    ),
    Case(
        "agent_tasks_child_dedupe_reserved",
        "23514",
        _keyed_child("k1"),
        _child(child_key="k2", dedupe_key=_child_key("k2"), input_hash=H),
        label="other-parent",
    ),
    Case("agent_tasks_parent_fkey", "23503", _child(), _child(parent_of="b")),
    Case("agent_tasks_child_key", "23505", _sibling("k1"), _sibling("k1")),
    Case("agent_tasks_child_key_valid", "23514", _child(child_key="k"), _child(child_key="")),
    Case(
        "agent_tasks_child_key_valid",
        "23514",
        _child(child_key="k"),
        task(child_key="k"),
        label="no-parent",
    ),
    Case(
        "agent_tasks_wait_children_valid",
        "23514",
        task(state="waiting", wait_children=1),
        task(state="waiting", wait_children=0),
    ),
    # ---- G24: a schedule fires at most one task per tick ---------------------------------
    Case(
        "agent_tasks_schedule_tick_key",
        "23505",
        _ticked(timedelta(hours=2), shared=True),
        _ticked(timedelta(hours=2), shared=True),
    ),
    Case(
        "agent_tasks_schedule_guard", "AG017", _ticked(timedelta(0)), _ticked(timedelta(seconds=1))
    ),
    Case(
        "agent_tasks_schedule_guard",
        "AG017",
        _ticked(timedelta(hours=3)),
        # A tick of the rule (whole hours from HOUR), a day ahead: refused for being ahead.
        _ticked(timedelta(hours=(datetime.now(UTC) - HOUR) // timedelta(hours=1) + 24)),
        label="future",
    ),
    Case(
        "agent_tasks_schedule_guard",
        "AG017",
        _ticked(timedelta(0)),
        _ticked(timedelta(0), of="b"),
        label="other-tenant",
    ),
    Case(
        "agent_tasks_schedule_guard",
        "AG017",
        _ticked(timedelta(0)),
        # A whole hour from HOUR, but before the schedule's anchor: no tick of its rule
        # (0019.ticks_from_the_anchor; before it, is_tick said NULL and the guard let it by).
        _ticked(timedelta(hours=-1)),
        label="before-anchor",
    ),
    Case("agent_tasks_schedule_fixed", "AG017", _retick("current_step"), _retick("schedule_tick")),
    Case(
        "agent_tasks_schedule_tick_valid",
        "23514",
        raw_task(),
        raw_task(schedule_tick=HOUR),
        role="replica",
    ),
    Case("agent_schedules_name_key", "23505", _schedule(name="dup"), _schedule(name="dup")),
    Case(
        "agent_schedules_pkey",
        "23505",
        _schedule(id=_SCHEDULE),
        _schedule(id=_SCHEDULE),
        role="admin",
    ),
    Case(
        "agent_schedules_tenant_fkey",
        "23503",
        _schedule(),
        _schedule(tenant_id=lambda c: uuid.uuid4()),
        role="admin",
    ),
    Case("agent_schedules_one_rule", "23514", _schedule(), _schedule(cron="0 * * * *")),
    Case(
        "agent_schedules_one_rule",
        "23514",
        _schedule(),
        _schedule(every=None),
        label="none",
    ),
    Case(
        "agent_schedules_every_valid",
        "23514",
        _schedule(every=timedelta(days=1)),
        _schedule(every=timedelta(hours=1, microseconds=5)),
    ),
    Case(
        "agent_schedules_cron_valid",
        "23514",
        _schedule(every=None, cron="0 * * * *"),
        _schedule(every=None, cron="61 * * * *"),
    ),
    Case(
        "agent_schedules_anchor_valid",
        "23514",
        _schedule(),
        _schedule(anchor=HOUR + timedelta(microseconds=1)),
    ),
    Case(
        "agent_schedules_catch_up_valid",
        "23514",
        _schedule(catch_up="all"),
        _schedule(catch_up="some"),
    ),
    Case(
        "agent_schedules_next_tick_valid",
        "23514",
        _schedule(next_tick_at=HOUR + timedelta(hours=5)),
        _schedule(next_tick_at=HOUR + timedelta(hours=5, seconds=1)),
    ),
    Case(
        "agent_schedules_next_tick_valid",
        "23514",
        _schedule(next_tick_at=HOUR),
        # On the rule's grid, an hour before the anchor (0019.ticks_from_the_anchor).
        _schedule(next_tick_at=HOUR - timedelta(hours=1)),
        label="before-anchor",
    ),
    Case("agent_schedules_name_valid", "23514", _schedule(name="n"), _schedule(name="")),
    Case(
        "agent_schedules_task_type_valid",
        "23514",
        _schedule(task_type="t"),
        _schedule(task_type=""),
    ),
    Case(
        "agent_schedules_workflow_version_valid",
        "23514",
        _schedule(workflow_version="2"),
        _schedule(workflow_version=""),
    ),
    Case(
        "agent_schedules_task_deadline_valid",
        "23514",
        _schedule(task_deadline=timedelta(hours=1)),
        _schedule(task_deadline=timedelta(hours=-1)),
    ),
    Case(
        "agent_schedules_params_valid",
        "23514",
        _schedule(params='{"n": 1}'),
        _schedule(params="[1]"),
    ),
    # Exactly 64 KiB as text is allowed, a byte more is not ('{"k": "..."}' is 9 bytes
    # around the string; kills gen-0007.schedules-agent_schedules_params_valid-cmp-2).
    Case(
        "agent_schedules_params_valid",
        "23514",
        _schedule(params='{"k": "' + "x" * (65536 - 9) + '"}'),
        _schedule(params='{"k": "' + "x" * (65536 - 8) + '"}'),
        label="at-the-limit",
    ),
    # ---- G25: a step is recorded once per task and name, under the task's lease ----------
    Case("agent_steps_guard", "AG018", _step_row(), _step_row(lease_token=2)),
    Case(
        "agent_steps_guard",
        "AG018",
        _step_row(),
        _step_row(claimed=False),
        label="not-running",
    ),
    Case(
        "agent_steps_guard",
        "AG018",
        _step_row(kind="sleep", state="waiting", wake_at=FUTURE, then={"state": "done"}),
        _step_row(kind="sleep", state="waiting", wake_at=FUTURE, then={"wake_at": PAST}),
        label="changed",
    ),
    Case(
        "agent_steps_guard",
        "AG018",
        _step_row(kind="signal", state="waiting", then={"state": "done"}),
        _step_row(result='{"n": 1}', then={"result": '{"n": 2}'}),
        label="recorded",
    ),
    Case(
        "agent_steps_guard",
        "AG018",
        _step_row(signals=1, kind="signal", signal_seq=1),
        _step_row(signals=1, kind="signal", signal_seq=2),
        label="no-signal",
    ),
    # The signal taken must be its own task's: another task of the tenant sent one at that
    # place is no signal of this one (kills gen-0008.steps-agentdb_guard_step-and-6).
    Case(
        "agent_steps_guard",
        "AG018",
        _step_row(signals=1, kind="signal", signal_seq=1),
        _step_row(others=1, kind="signal", signal_seq=1),
        label="another-task-s-signal",
    ),
    Case("agent_steps_guard", "AG012", _step_row(), _step_row(task_state="cancelled")),
    # Every finished state, dead too (kills gen-0008.steps-agentdb_guard_step-list-4).
    Case("agent_steps_guard", "AG012", _step_row(), _step_row(task_state="dead"), label="dead"),
    Case(
        "agent_steps_guard",
        "AG013",
        _step_row(deadline=FUTURE),
        _step_row(claimed=False, deadline=PAST),
    ),
    Case("agent_steps_pkey", "23505", _two_steps(), _two_steps(name="wait-1")),
    Case(
        "agent_steps_signal_key",
        "23505",
        _two_steps(),
        _two_steps(kind="signal", signal_seq=1),
    ),
    Case("agent_steps_task_fkey", "23503", _step_row(), _step_row(on="b")),
    Case(
        "agent_steps_waits_valid",
        "23514",
        _step_row(kind="children", state="waiting"),
        _step_row(kind="step", state="waiting"),
    ),
    Case(
        "agent_steps_waits_valid",
        "23514",
        _step_row(kind="sleep", state="waiting", wake_at=FUTURE),
        _step_row(kind="sleep", state="waiting"),
        label="sleep-end",
    ),
    Case(
        "agent_steps_waits_valid",
        "23514",
        _step_row(signals=1, kind="signal", signal_seq=1),
        _step_row(signals=1, kind="step", signal_seq=1),
        label="taker",
    ),
    # A signal step may wait (kills gen-0008.steps-agent_steps_waits_valid-list-1).
    Case(
        "agent_steps_waits_valid",
        "23514",
        _step_row(kind="signal", state="waiting"),
        _step_row(kind="step", state="waiting"),
        label="signal-waits",
    ),
    Case(
        "agent_steps_name_valid", "23514", _step_row(name="p"), _step_row(name=""), role="replica"
    ),
    Case(
        "agent_steps_kind_valid",
        "23514",
        _step_row(kind="step"),
        _step_row(kind="loop"),
        role="replica",
    ),
    Case(
        "agent_steps_state_valid",
        "23514",
        _step_row(kind="sleep", state="waiting", wake_at=FUTURE),
        _step_row(kind="sleep", state="paused", wake_at=FUTURE),
        role="replica",
    ),
    Case(
        "agent_steps_lease_token_valid",
        "23514",
        _step_row(lease_token=1),
        _step_row(lease_token=0),
        role="replica",
    ),
    Case(
        "agent_steps_input_hash_format",
        "23514",
        _step_row(input_hash=H),
        _step_row(input_hash="nothex"),
    ),
    Case("agent_steps_result_valid", "23514", _step_row(result='{"n": 1}'), _step_row(result=BIG)),
    Case(
        "agent_steps_result_no_secrets",
        "23514",
        _step_row(result='{"password": "[redacted]"}'),
        _step_row(result='{"password": "hunter2"}'),
    ),
    # ---- G20: no message for a cancelled task, whoever enqueues it ------------------------
    Case("agent_outbox_for_open_task", "AG012", _message_for(None), _message_for("cancelled")),
    Case(
        "agent_outbox_for_open_task",
        "AG012",
        _message_for("dead"),
        _message_for("cancelled"),
        label="dead",
    ),
]


@pytest.fixture
async def ctx(db: Database, tenants: Tenants, runtime_conn: asyncpg.Connection) -> Ctx:
    conn = runtime_conn
    task_a = await F.create_task(conn, tenants.a)
    task_b = await F.create_task(conn, tenants.b)
    op_a = await F.create_operation(conn, tenants.a, task_a)
    op_b = await F.create_operation(conn, tenants.b, task_b)
    return Ctx(tenants.a, tenants.b, task_a, task_b, op_a, op_b)


# Cases whose edge only one clock can draw, deselected on Citus with their reason.
_PLAIN_ONLY = {
    "delete-at-retention-edge": "the guard reads the worker's now(), which starts when the "
    "worker's part of the transaction does, after the coordinator's now() the event's "
    "retain_until was set from: no single instant to stand on (the edge is held on plain "
    "Postgres; the delete of a retained event is refused on Citus by the other cases)",
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.plain_postgres(_PLAIN_ONLY[c.label]))
        if c.label in _PLAIN_ONLY
        else c
        for c in CASES
    ],
    ids=lambda c: c.id,
)
async def test_attack_is_refused(
    case: Case, ctx: Ctx, runtime_conn: asyncpg.Connection, admin_conn: asyncpg.Connection
) -> None:
    conn = runtime_conn if case.role == "runtime" else admin_conn
    if _pg.ON_CITUS and case.citus == ABSENT:
        gone = await admin_conn.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE conname = $1", case.name
        )
        assert gone == 0, f"{case.name} exists on Citus: attack it there too"
        return
    if _pg.ON_CITUS and case.citus == NO_GLOBAL_LIMITS:
        with pytest.raises(asyncpg.CheckViolationError) as local_only:
            await case.good(conn, ctx)  # even the positive control
        assert _pg.constraint_of(local_only.value) == "agent_global_rate_limits_local_only"
        return
    if case.role == "replica":
        # Switches off triggers (guards and FK checks alike) for this session:
        # what remains is the CHECK itself. On Citus the setting must reach the
        # workers, where the triggers fire: SET LOCAL, propagated.
        if _pg.ON_CITUS:
            await conn.execute("SET citus.propagate_set_commands = 'local'")
        else:
            await conn.execute("SET session_replication_role = replica")
    await _as(case, conn, ctx, case.good)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await _as(case, conn, ctx, case.bad)
    if _pg.ON_CITUS and case.citus is not None:
        assert refused.value.sqlstate == case.citus, refused.value
        return
    assert refused.value.sqlstate == case.sqlstate, refused.value
    expected = case.name if case.constraint is None else case.constraint
    if not expected:
        # A GRANT refused it: not a named object, so agentdb leaves it unmapped.
        assert _db.translate(refused.value) is refused.value
        return
    mapped = _db.translate(refused.value)
    assert type(mapped) is expected_error(case), mapped
    assert isinstance(mapped, errors.InvariantViolation)
    if _pg.ON_CITUS and case.sqlstate.startswith("AG"):
        # Citus drops the constraint field of a worker's error, and a guard's
        # message does not name its trigger: the type and SQLSTATE are all
        # that reach the client (README, "Scaling out with Citus").
        # (A TRUNCATE guard fires on the coordinator and keeps its name.)
        assert mapped.constraint in (None, case.name), mapped
        assert mapped.sqlstate == case.sqlstate, mapped
        return
    if not _pg.ON_CITUS and not EVENTS_BY_MONTH:  # by month: a partition's index names it
        assert refused.value.constraint_name == expected, refused.value
    assert (mapped.guarantee, mapped.constraint, mapped.sqlstate) == (
        case.guarantee,
        case.name,
        case.sqlstate,
    )


async def _as(case: Case, conn: asyncpg.Connection, ctx: Ctx, step: Step) -> Any:
    if case.role == "replica" and _pg.ON_CITUS:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            return await step(conn, ctx)
    return await step(conn, ctx)


# Written out here, apart from agentdb.errors, so a broken mapping cannot agree with itself.
_BY_SQLSTATE: dict[str, type[errors.InvariantViolation]] = {
    "AG001": errors.InvalidTransition,
    "AG002": errors.VersionRuleViolation,
    "AG003": errors.AppendOnlyViolation,
    "AG004": errors.ImmutableColumn,
    "AG005": errors.LeaseTokenRegression,
    "AG006": errors.MissingEvent,
    "AG007": errors.TenantScopeMissing,
    "AG008": errors.ImmutableKey,
    "AG009": errors.ConcurrencyLimitExceeded,
    "AG010": errors.BudgetRuleViolation,
    "AG011": errors.RateLimited,
    "AG012": errors.TaskFinished,
    "AG013": errors.DeadlineExceeded,
    "AG014": errors.SignalRuleViolation,
    "AG015": errors.SignalIsolationViolation,
    "AG016": errors.FanInIsolationViolation,
    "AG017": errors.ScheduleRuleViolation,
    "AG018": errors.StepRuleViolation,
    "23503": errors.TenantMismatch,
    "23505": errors.DuplicateKey,
    "23514": errors.InvariantViolation,
}
_BY_NAME: dict[str, type[errors.InvariantViolation]] = {
    "agent_tasks_params_valid": errors.PayloadTooLarge,
    "agent_operations_result_valid": errors.PayloadTooLarge,
    "agent_events_payload_size": errors.PayloadTooLarge,
    "agent_outbox_payload_size": errors.PayloadTooLarge,
    "agent_signals_payload_valid": errors.PayloadTooLarge,
    "agent_schedules_params_valid": errors.PayloadTooLarge,
    "agent_steps_result_valid": errors.PayloadTooLarge,
    "agent_steps_result_no_secrets": errors.SecretInPayload,
    "agent_events_payload_no_secrets": errors.SecretInPayload,
    "agent_budgets_within_limit": errors.BudgetExceeded,
    "agent_rate_limits_within_limit": errors.RateLimited,
    "agent_global_rate_limits_within_limit": errors.RateLimited,
}


def expected_error(case: Case) -> type[errors.InvariantViolation]:
    return _BY_NAME.get(case.name, _BY_SQLSTATE[case.sqlstate])


def attacked_names() -> set[str]:
    """Objects some case shows refusing a write by name (grant-only refusals don't count)."""
    return {c.name for c in CASES if c.constraint != ""}


def test_every_guard_rule_is_attacked() -> None:
    """Each rule of a multi-rule guard has its own attack, refused with that rule's SQLSTATE."""
    attacked = {(c.name, c.sqlstate) for c in CASES if c.constraint != ""}
    assert {(r.name, r.sqlstate) for r in RULES} <= attacked
