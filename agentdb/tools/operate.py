"""The operator's everyday actions from the command line (issue 39).

``agentdb tenant create|list|get``, ``agentdb task create|get|list|cancel|retry|events``,
``agentdb signal send``, ``agentdb approve|reject``, ``agentdb effects list|reconcile|fail``,
``agentdb outbox list|retry``. Each action is the library's own guarded
statement (the database refuses what it refuses for any caller: an approval
by a lease holder, a retry of a cancelled task, another tenant's row), run in
a transaction scoped to the tenant named (``--tenant``, an id or a name), so
a login that is a member of ``agentdb_operator`` sees that tenant and no
other. The actor each audit event names is ``--as``, else
``agentdb-cli:<os user>``. Bad input is one line on stderr and exit 2; a
refusal or a row that is not there, one line and exit 1; ``--json`` prints
what happened as JSON.
"""

from __future__ import annotations

import argparse
import getpass
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from agentdb import _db, operations, outbox, overview, signals, tasks, tenancy
from agentdb.errors import AgentDBError, ConfigurationError
from agentdb.models import Operation, Signal, Task
from agentdb.tools._common import add_target, dsn_from, run_with_pool
from agentdb.tools.console.pages import age

__all__ = [
    "add_approve",
    "add_effects",
    "add_outbox",
    "add_reject",
    "add_signal",
    "add_task",
    "add_tenant_actions",
    "database_refusal",
    "resolve_tenant",
]

T = TypeVar("T")
Sub = "argparse._SubParsersAction[argparse.ArgumentParser]"


# ---- shared ---------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser, *, tenant: bool = True, actor: bool = False) -> None:
    add_target(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    if tenant:
        p.add_argument("--tenant", required=True, help="the tenant: its id or its name")
    if actor:
        p.add_argument(
            "--as",
            dest="actor",
            metavar="PRINCIPAL",
            help="who acts, as the audit event names it (default: agentdb-cli:<os user>)",
        )


def _actor(args: argparse.Namespace) -> str:
    actor: str | None = getattr(args, "actor", None)
    if actor is not None and not 1 <= len(actor.strip()) <= 200:
        raise ConfigurationError("--as must be 1 to 200 characters")
    return actor or f"agentdb-cli:{getpass.getuser()}"


def parse_uuid(text: str, what: str) -> uuid.UUID:
    """``text`` as a UUID, or one line saying it is not one (exit 2)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConfigurationError(f"{text!r} is not a {what} id (a UUID)") from None


def _json_object(text: str | None, what: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


async def resolve_tenant(db: _db.Executor, text: str) -> uuid.UUID:
    """The tenant ``text`` names: a tenant of that name, else the id it spells.

    Raises:
        ConfigurationError: no tenant visible to this login has that name, and
            it is not an id.
    """
    found = await tenancy.tenant_by_name(db, text)
    if found is not None:
        return found.id
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConfigurationError(
            f"no tenant named {text!r} (that this login may see); pass its name or id"
        ) from None


def _run(
    args: argparse.Namespace,
    body: Callable[[_db.Conn, uuid.UUID | None], Awaitable[T]],
) -> T:
    """Run ``body(conn, tenant)`` in one transaction scoped to ``--tenant`` (when given)."""
    dsn = dsn_from(args)
    tenant_text: str | None = getattr(args, "tenant", None)

    async def main(pool: _db.Pool) -> T:
        tenant = None
        if tenant_text is not None:
            tenant = await resolve_tenant(pool, tenant_text)
            async with tenancy.tenant_scope(pool, tenant) as conn:
                return await body(conn, tenant)
        async with _db.transaction(pool) as conn:
            return await body(conn, None)

    try:
        return run_with_pool(dsn, 2, main, schema=args.schema)
    except AgentDBError:
        raise
    except Exception as exc:
        refused = database_refusal(exc)
        if refused is None:
            raise
        raise refused from exc


def database_refusal(exc: BaseException) -> AgentDBError | None:
    """A database error agentdb has no class for (it hands those on unchanged) as one
    line: a privilege this login lacks (42501), say. ``None``: not a database error."""
    sqlstate = getattr(exc, "sqlstate", None)
    if not isinstance(sqlstate, str):
        return None
    message = getattr(exc, "message", None) or str(exc)
    return AgentDBError(f"the database refused (SQLSTATE {sqlstate}): {message}")


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _emit(args: argparse.Namespace, value: Any, lines: list[str]) -> int:
    if args.json:
        print(json.dumps(_plain(value), indent=2, sort_keys=True))
    else:
        for line in lines:
            print(line)
    return 0


# ---- tenants --------------------------------------------------------------------------


def add_tenant_actions(tenant_sub: Any) -> None:
    """``tenant create|list|get`` beside ``tenant delete`` (agentdb.tools.tenant)."""
    p = tenant_sub.add_parser("create", help="create a tenant, or answer the one of that name")
    p.add_argument("name", help="the tenant's name (unique)")
    _common(p, tenant=False)
    p.set_defaults(func=_tenant_create)
    p = tenant_sub.add_parser("list", help="the tenants this login may see")
    _common(p, tenant=False)
    p.set_defaults(func=_tenant_list)
    p = tenant_sub.add_parser("get", help="one tenant, by name or id")
    p.add_argument("tenant", help="its name or id")
    _common(p, tenant=False)
    p.set_defaults(func=_tenant_get)


def _tenant_create(args: argparse.Namespace) -> int:
    if not 1 <= len(args.name) <= 200:
        raise ConfigurationError("a tenant name is 1 to 200 characters")

    async def body(conn: _db.Conn, _: uuid.UUID | None) -> tuple[uuid.UUID, bool]:
        before = await tenancy.tenant_by_name(conn, args.name)
        tid = await tenancy.create_tenant(conn, args.name)
        return tid, before is None

    tid, created = _run(args, body)
    word = "created" if created else "exists"
    return _emit(
        args,
        {"id": tid, "name": args.name, "created": created},
        [f"{tid} {args.name} ({word})"],
    )


def _tenant_list(args: argparse.Namespace) -> int:
    async def body(conn: _db.Conn, _: uuid.UUID | None) -> list[tenancy.Tenant]:
        return await tenancy.list_tenants(conn)

    found = _run(args, body)
    return _emit(args, found, [f"{t.id} {t.name} {t.state}" for t in found])


def _tenant_get(args: argparse.Namespace) -> int:
    async def body(conn: _db.Conn, _: uuid.UUID | None) -> tenancy.Tenant:
        by_name = await tenancy.tenant_by_name(conn, args.tenant)
        if by_name is not None:
            return by_name
        tid = parse_uuid(args.tenant, "tenant") if _looks_like_uuid(args.tenant) else None
        if tid is not None:
            for t in await tenancy.list_tenants(conn, limit=100_000):
                if t.id == tid:
                    return t
        raise ConfigurationError(f"no tenant {args.tenant!r} (that this login may see)")

    t = _run(args, body)
    return _emit(args, t, [f"{t.id} {t.name} {t.state}"])


def _looks_like_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


# ---- tasks ----------------------------------------------------------------------------


def add_task(sub: Any) -> None:
    p = sub.add_parser("task", help="create, read, cancel and retry tasks")
    task_sub = p.add_subparsers(dest="task_command", required=True, metavar="ACTION")

    p = task_sub.add_parser("create", help="create a task (pending)")
    p.add_argument("task_type")
    p.add_argument("--params", help="the task's parameters, a JSON object")
    p.add_argument("--dedupe-key", help="a retried create with this key answers the same task")
    _common(p, actor=True)
    p.set_defaults(func=_task_create)

    p = task_sub.add_parser("get", help="one task")
    p.add_argument("task_id")
    _common(p)
    p.set_defaults(func=_task_get)

    p = task_sub.add_parser("list", help="the tenant's tasks, most recently changed first")
    p.add_argument("--state", choices=_STATES, help="only tasks in this state")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _common(p)
    p.set_defaults(func=_task_list)

    for action, helptext in (
        ("cancel", "cancel a pending, waiting or running task (G20)"),
        ("retry", "put a failed or dead task back to pending"),
    ):
        p = task_sub.add_parser(action, help=helptext)
        p.add_argument("task_id")
        p.add_argument("--reason", help="why, for the audit event")
        _common(p, actor=True)
        p.set_defaults(func=_task_cancel if action == "cancel" else _task_retry)

    p = task_sub.add_parser("events", help="a task's timeline: events (--json: steps, effects too)")
    p.add_argument("task_id")
    _common(p)
    p.set_defaults(func=_task_events)


_STATES = ("pending", "waiting", "running", "succeeded", "failed", "cancelled", "dead")


def _task_line(t: Task) -> str:
    error = f" error={t.last_error!r}" if t.last_error else ""
    return f"{t.id} {t.task_type} {t.state} attempts={t.attempts}/{t.max_attempts}{error}"


def _task_create(args: argparse.Namespace) -> int:
    params = _json_object(args.params, "--params") or {}

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Task:
        assert tenant is not None
        return await tasks.create(
            conn,
            tenant,
            args.task_type,
            params=params,
            dedupe_key=args.dedupe_key,
            actor=_actor(args),
        )

    t = _run(args, body)
    return _emit(args, t, [_task_line(t)])


def _task_get(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Task:
        assert tenant is not None
        return await tasks.get(conn, tenant, task_id)

    t = _run(args, body)
    return _emit(args, t, [_task_line(t)])


def _task_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigurationError("--limit must be at least 1")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> list[dict[str, Any]]:
        assert tenant is not None
        return await overview.task_list(conn, tenant, state=args.state, limit=args.limit)

    rows = _run(args, body)
    lines = [
        f"{r['id']} {r['task_type']} {r['state']} age={age(r['age_s'])}"
        + (f" error={r['last_error']!r}" if r["last_error"] else "")
        for r in rows
    ]
    return _emit(args, rows, lines)


def _task_cancel(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Task:
        assert tenant is not None
        return await tasks.cancel(conn, tenant, task_id, reason=args.reason, actor=_actor(args))

    t = _run(args, body)
    return _emit(args, t, [_task_line(t)])


def _task_retry(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Task:
        assert tenant is not None
        return await tasks.retry(conn, tenant, task_id, actor=_actor(args), reason=args.reason)

    t = _run(args, body)
    return _emit(args, t, [_task_line(t)])


def _task_events(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> overview.Timeline:
        assert tenant is not None
        await tasks.get(conn, tenant, task_id)  # NotFound: one line, exit 1
        return await overview.timeline(conn, tenant, task_id)

    tl = _run(args, body)
    lines = []
    for e in tl.events:
        move = f" {e['from_state'] or '-'} -> {e['to_state']}" if e["to_state"] else ""
        lines.append(f"{e['created_at']} {e['event_type']}{move} by {e['actor_id']}")
    return _emit(args, tl.as_json(), lines)


# ---- signals and approvals ------------------------------------------------------------


def add_signal(sub: Any) -> None:
    p = sub.add_parser("signal", help="send a signal to a task (G22)")
    signal_sub = p.add_subparsers(dest="signal_command", required=True, metavar="ACTION")
    p = signal_sub.add_parser("send", help="send signal NAME to task TASK")
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--payload", help="a JSON object")
    p.add_argument("--dedupe-key", help="a retried send with this key records one signal")
    _common(p, actor=True)
    p.set_defaults(func=_signal_send)


def _signal_line(s: Signal) -> str:
    what = f"{s.kind} {s.decision}" if s.decision else s.kind
    return f"task {s.task_id} signal #{s.seq} {s.name} ({what}) from {s.sender}" + (
        "" if s.created else " (already recorded)"
    )


def _signal_send(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")
    payload = _json_object(args.payload, "--payload")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Signal:
        assert tenant is not None
        return await signals.signal(
            conn, tenant, task_id, args.name, payload,
            dedupe_key=args.dedupe_key, sender=_actor(args),
        )  # fmt: skip

    s = _run(args, body)
    return _emit(args, s, [_signal_line(s)])


def _add_decision(sub: Any, verb: str) -> None:
    p = sub.add_parser(verb, help=f"{verb} a task waiting for an approval (G22)")
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--comment", help="a word for the audit trail and the handler")
    p.add_argument(
        "--name", help="the signal's name (default: the one the task waits for, else 'approval')"
    )
    _common(p)
    # Required here: who approves is the point (the database refuses a lease holder).
    p.add_argument("--as", dest="actor", metavar="PRINCIPAL", required=True, help="the approver")
    p.set_defaults(func=_decide, decision="approved" if verb == "approve" else "rejected")


def add_approve(sub: Any) -> None:
    _add_decision(sub, "approve")


def add_reject(sub: Any) -> None:
    _add_decision(sub, "reject")


async def waited_signal(conn: _db.Executor, tenant: uuid.UUID, task_id: uuid.UUID) -> str:
    """The name of the signal task ``task_id`` waits for, else ``'approval'``."""
    for a in await overview.approvals(conn, tenant, limit=10_000):
        if a["id"] == str(task_id) and a["wait_signal"]:
            return str(a["wait_signal"])
    return "approval"


def _decide(args: argparse.Namespace) -> int:
    task_id = parse_uuid(args.task_id, "task")
    approver = _actor(args)

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Signal:
        assert tenant is not None
        name = args.name or await waited_signal(conn, tenant, task_id)
        return await signals.approve(
            conn, tenant, task_id,
            approver=approver, decision=args.decision, comment=args.comment, name=name,
        )  # fmt: skip

    s = _run(args, body)
    return _emit(args, s, [_signal_line(s)])


# ---- effects --------------------------------------------------------------------------


def add_effects(sub: Any) -> None:
    p = sub.add_parser("effects", help="the effect ledger: unsettled operations, reconcile, fail")
    effects_sub = p.add_subparsers(dest="effects_command", required=True, metavar="ACTION")
    p = effects_sub.add_parser("list", help="the tenant's unsettled effects (G13)")
    p.add_argument(
        "--unsettled",
        action="store_true",
        required=True,
        help="reserved, in flight or unknown, under no live lease",
    )
    p.add_argument("--limit", type=int, default=100)
    _common(p)
    p.set_defaults(func=_effects_list)

    p = effects_sub.add_parser("reconcile", help="settle an effect from the provider's records")
    p.add_argument("operation_id", metavar="OP")
    p.add_argument("--reference", required=True, help="the provider's reference for the effect")
    outcome = p.add_mutually_exclusive_group()
    outcome.add_argument("--succeeded", action="store_true", help="it happened (the default)")
    outcome.add_argument("--failed", action="store_true", help="it did not happen")
    p.add_argument("--result", help="what the provider says, a JSON object")
    p.add_argument("--error", help="with --failed: why")
    _common(p, actor=True)
    p.set_defaults(func=_effects_reconcile)

    p = effects_sub.add_parser("fail", help="record that an effect did not happen")
    p.add_argument("operation_id", metavar="OP")
    p.add_argument("--error", required=True, help="why (the provider's answer)")
    _common(p, actor=True)
    p.set_defaults(func=_effects_fail)


def _op_line(o: Operation) -> str:
    ref = f" ref={o.provider_reference}" if o.provider_reference else ""
    return f"{o.id} {o.action} {o.state} key={o.idempotency_key}{ref}"


def _effects_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigurationError("--limit must be at least 1")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> list[dict[str, Any]]:
        assert tenant is not None
        return await overview.unsettled(conn, tenant, limit=args.limit)

    rows = _run(args, body)
    lines = [
        f"{r['id']} {r['action']} {r['state']} task={r['task_id']} age={age(r['age_s'])}"
        for r in rows
    ]
    return _emit(args, rows, lines)


def _effects_reconcile(args: argparse.Namespace) -> int:
    op_id = parse_uuid(args.operation_id, "operation")
    result = _json_object(args.result, "--result")
    if args.error and not args.failed:
        raise ConfigurationError("--error goes with --failed")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Operation:
        assert tenant is not None
        op = await operations.get(conn, tenant, op_id)
        return await operations.reconcile(
            conn, op,
            succeeded=not args.failed, provider_reference=args.reference,
            result=result, error=args.error, actor=_actor(args),
        )  # fmt: skip

    o = _run(args, body)
    return _emit(args, o, [_op_line(o)])


def _effects_fail(args: argparse.Namespace) -> int:
    op_id = parse_uuid(args.operation_id, "operation")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> Operation:
        assert tenant is not None
        op = await operations.get(conn, tenant, op_id)
        return await operations.fail(conn, op, args.error, actor=_actor(args))

    o = _run(args, body)
    return _emit(args, o, [_op_line(o)])


# ---- outbox ---------------------------------------------------------------------------


def add_outbox(sub: Any) -> None:
    p = sub.add_parser("outbox", help="dead messages: list and retry")
    outbox_sub = p.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    p = outbox_sub.add_parser("list", help="the tenant's dead messages")
    p.add_argument("--dead", action="store_true", required=True, help="the messages given up on")
    p.add_argument("--limit", type=int, default=100)
    _common(p)
    p.set_defaults(func=_outbox_list)
    p = outbox_sub.add_parser("retry", help="put a dead message back to pending")
    p.add_argument("message_id", metavar="ID")
    _common(p, actor=True)
    p.set_defaults(func=_outbox_retry)


def _outbox_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigurationError("--limit must be at least 1")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> list[dict[str, Any]]:
        assert tenant is not None
        return await overview.outbox(conn, tenant, state="dead", limit=args.limit)

    rows = _run(args, body)
    lines = [
        f"{r['id']} {r['topic']} dead attempts={r['attempts']} error={r['last_error']!r}"
        for r in rows
    ]
    return _emit(args, rows, lines)


def _outbox_retry(args: argparse.Namespace) -> int:
    message_id = parse_uuid(args.message_id, "message")

    async def body(conn: _db.Conn, tenant: uuid.UUID | None) -> outbox.Delivery:
        assert tenant is not None
        return await outbox.retry(conn, tenant, message_id, actor=_actor(args))

    d = _run(args, body)
    return _emit(args, d, [f"{d.id} {d.topic} {d.state}"])
