"""The runtime's writes on Citus: per tenant, each routed whole to one worker.

On a distributed schema (``agentdb migrate --citus``) :mod:`agentdb.leases`,
:mod:`agentdb.tasks`, :mod:`agentdb.operations`, :mod:`agentdb.outbox` and
:mod:`agentdb.budgets` run these instead of their one-statement forms, which
Citus cannot route (see ``queries/routed.sql``): each is the routed twin of a
single-node form there (:func:`agentdb._citus.routing.twin`).
Every function here works on one tenant inside one transaction: an UPDATE
that names the tenant, then its events and messages as single-row inserts
sent together, so the transaction touches one worker and commits there
without two-phase commit. Work across tenants is discovered by a lock-free
read of every shard, kept for the claims of the next second (:class:`_Ring`),
and taken tenant by tenant.
"""

from __future__ import annotations

import bisect
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from agentdb import _db
from agentdb._db.jsonb import EVENT_PAYLOAD_CAP, document
from agentdb.errors import ConcurrencyLimitExceeded, TransientError
from agentdb.models import Operation

__all__ = [
    "bury",
    "claim",
    "create_task",
    "expire_deadlines",
    "hold",
    "hold_retry",
    "lock_budgets",
    "outbox_claim",
    "outbox_delivered",
    "outbox_retry",
    "release",
    "reserve",
    "settle",
    "task_retry",
    "tenant_create",
    "transition",
]

_Q = _db.queries(__name__)


@dataclass(slots=True)
class _Ring:
    """The tenants one discovery found, for the claims that follow it.

    A discovery reads every shard (32 by default: 32 remote commands through
    the coordinator) and a tenant's claim reads one, so successive claims walk
    on through what the last discovery found instead of asking again. Fair as
    the walk itself (G18): the ring is in the walk's order, and the claims
    take its tenants in turn from the one after the caller's last.

    ``complete``: the discovery found fewer than it asked for, so the ring held
    every tenant with work then, and a walk that reaches its end wraps round it.
    Otherwise it holds an arc of the walk, and the walk past its end asks
    again from there. A tenant that gave less than its claim asked for is
    ``dry``: passed over until the ring is read again; a ring with none left is
    read again at once. A tenant whose work arrived after the discovery waits at most
    :data:`_RING_AGE` seconds.
    """

    owner: object  # the pool or connection: its id is not reused while the ring lives
    born: float
    tenants: list[uuid.UUID]
    complete: bool
    dry: set[uuid.UUID] = field(default_factory=set)

    def next(self, after: uuid.UUID | None, want: int) -> list[uuid.UUID] | None:
        """Up to ``want`` tenants after ``after``; ``None``: this ring cannot tell."""
        live = [t for t in self.tenants if t not in self.dry]
        if not live:
            return None
        if self.complete:
            order = sorted(live)
            start = bisect.bisect_right(order, after) if after is not None else 0
            return (order[start:] + order[:start])[:want]
        if after is None or after not in self.tenants:
            return None
        rest = [t for t in self.tenants[self.tenants.index(after) + 1 :] if t not in self.dry]
        return rest[:want] if len(rest) >= want else None


# Per pool or connection, per discovery statement and task types; the oldest go.
_RING_SIZE = 64  # tenants one discovery asks for
_RING_AGE = 1.0  # seconds a ring is walked before it is read again
_RINGS_KEPT = 64
_RINGS: OrderedDict[tuple[int, str, tuple[str, ...] | None], _Ring] = OrderedDict()


def _ring_key(
    db: _db.Executor, query: str, task_types: list[str] | None
) -> tuple[object, tuple[int, str, tuple[str, ...] | None]]:
    owner = db if _db.is_pool(db) else _db.raw_connection(cast("_db.Conn", db))
    return owner, (id(owner), query, tuple(task_types) if task_types is not None else None)


async def _next_tenants(
    db: _db.Executor,
    query: str,
    after: uuid.UUID | None,
    want: int,
    task_types: list[str] | None = None,
    *,
    discover: bool = False,
) -> tuple[list[uuid.UUID], bool]:
    """Up to ``want`` tenants with work after ``after`` (discovery ``query``): from the
    ring when it can tell, else (or with ``discover``) from one discovery that fills the
    ring again; and whether they were discovered just now."""
    owner, key = _ring_key(db, query, task_types)
    ring = _RINGS.get(key)
    if (
        not discover
        and ring is not None
        and ring.owner is owner
        and time.monotonic() - ring.born < _RING_AGE
    ):
        found = ring.next(after, want)
        if found is not None:
            return found, False
    limit = max(want, _RING_SIZE)
    extra = {"task_types": task_types} if query == "routed_due_tenants" else {}
    rows = await _db.fetch_many(db, _Q[query], after_tenant=after, max_tenants=limit, **extra)
    tenants = [r["tenant_id"] for r in rows]
    _RINGS[key] = _Ring(owner, time.monotonic(), tenants, complete=len(tenants) < limit)
    _RINGS.move_to_end(key)
    while len(_RINGS) > _RINGS_KEPT:
        _RINGS.popitem(last=False)
    return tenants[:want], True


def _dry(db: _db.Executor, query: str, task_types: list[str] | None, tenant: uuid.UUID) -> None:
    """``tenant`` gave less than its claim asked for: pass it over until the ring is read
    again."""
    owner, key = _ring_key(db, query, task_types)
    ring = _RINGS.get(key)
    if ring is not None and ring.owner is owner:
        ring.dry.add(tenant)


async def claim(
    db: _db.Executor,
    owner: str,
    *,
    batch: int,
    lease_ttl: timedelta | None,
    task_types: list[str] | None,
    after_tenant: uuid.UUID | None,
) -> list[_db.Record]:
    """The fair claim (G18) on Citus: tenants with work after ``after_tenant`` each
    offer their share of ``batch``, each tenant in its own single-worker transaction.

    Rows come back in the order the one-statement claim takes them: every
    tenant's first task in the walk's order, then their second ones, and so on.
    A tenant whose cap another writer filled while its claim ran (AG009) gives
    nothing this time; the tenants claimed before it in the walk stay claimed and
    are returned. A lost connection (or a failover) ends the walk: what it claimed
    by then is returned, and only a walk that claimed nothing raises.

    Raises:
        TransientError: the connection was lost before any tenant was claimed.
        mapped database errors.
    """
    # A few tenants more than the batch needs: one that is paused, full or
    # already drained by another worker gives its share to the next.
    query, want = "routed_due_tenants", max(batch, _PROBE)
    tenants, fresh = await _next_tenants(db, query, after_tenant, want, task_types)
    out = await _claim_walk(db, owner, tenants, batch, lease_ttl, task_types)
    if not out and not fresh:
        # Every tenant the ring offered gave nothing (drained, full, taken by
        # other workers): the ring is behind; one discovery, and walk that.
        tenants, _ = await _next_tenants(db, query, after_tenant, want, task_types, discover=True)
        out = await _claim_walk(db, owner, tenants, batch, lease_ttl, task_types)
    return out


async def _claim_walk(
    db: _db.Executor,
    owner: str,
    tenants: list[uuid.UUID],
    batch: int,
    lease_ttl: timedelta | None,
    task_types: list[str] | None,
) -> list[_db.Record]:
    """The claim of :func:`claim` over ``tenants``, in their order."""
    if not tenants:
        return []
    # As the one-statement claim: each offers ceil(batch / n) and the batch takes the
    # tenants' first tasks, then their second ones, so the first batch % n tenants of
    # the walk get one more than the others, and none of the first n gets nothing.
    base, extra = divmod(batch, min(batch, len(tenants)))
    out: list[_db.Record] = []
    gave: dict[uuid.UUID, int] = {}
    try:
        for i, tenant in enumerate(tenants):
            want = min(base + 1 if i < extra else base, batch - len(out))
            if want <= 0:
                break
            rows = await _claim_tenant(db, tenant, owner, want, lease_ttl, task_types)
            if rows:
                gave[tenant] = len(rows)
            if len(rows) < want:  # drained (or full, or held by other claimers)
                _dry(db, "routed_due_tenants", task_types, tenant)
            out += rows
        # As the one-statement claim shares the batch between the tenants that have
        # claimable work, the tenants that gave nothing (paused, full, drained)
        # leave their shares to the others: asked again, in walk order, each up to
        # its new share. (A tenant whose capped task type filled up in the first
        # pass then offers its other types.)
        if gave and len(out) < batch:
            share = -(-batch // len(gave))
            for tenant, given in gave.items():
                want = min(share - given, batch - len(out))
                if want > 0:
                    out += await _claim_tenant(db, tenant, owner, want, lease_ttl, task_types)
    except TransientError:
        # Each tenant's claim committed in its own transaction: raised, the ones
        # already made would sit leased and unworked until their leases ran out.
        if not out:
            raise
    return _as_taken(out)


def _as_taken(rows: list[_db.Record]) -> list[_db.Record]:
    """``rows``, claimed tenant by tenant, in the order the one-statement claim takes
    them (every tenant's first, then every tenant's second, ...). The worker's next
    walk starts after the last row's tenant: tenant by tenant that is the walk's last
    one, which has the short share, and would have it again in every claim; taken
    this way it is the last tenant that got one more, so the extra ones rotate."""
    step: dict[uuid.UUID, int] = {}
    nth: Counter[uuid.UUID] = Counter()
    keyed = []
    for row in rows:
        tenant = row["tenant_id"]
        step.setdefault(tenant, len(step))
        nth[tenant] += 1
        keyed.append((nth[tenant], step[tenant], row))
    return [row for _, _, row in sorted(keyed, key=lambda k: (k[0], k[1]))]


_PROBE = 8


async def _claim_tenant(
    db: _db.Executor,
    tenant: uuid.UUID,
    owner: str,
    want: int,
    lease_ttl: timedelta | None,
    task_types: list[str] | None,
) -> list[_db.Record]:
    try:
        # One statement outside any transaction block: Citus delegates the call
        # (agentdb_routed_claim, 0021.delegated_writes) to the tenant's node, where
        # the claim and its events commit together.
        rows = await _db.fetch_many(
            db, _Q["routed_claim"], tenant_id=tenant, lease_owner=owner, batch=want,
            lease_ttl=lease_ttl, task_types=task_types,
        )  # fmt: skip
    except ConcurrencyLimitExceeded:
        # The statement counted the running tasks in its snapshot; a writer that
        # committed after it and before its caps lock filled a slot, and the
        # trigger refused (the cap held; this tenant's claim rolled back whole).
        # Raising would lose the tenants already claimed in this walk: their
        # leases would run out unworked, an attempt spent on each.
        return []
    rows.sort(key=lambda r: r["ord"])
    return rows


async def bury(db: _db.Executor, actor: str, batch: int) -> list[_db.Record]:
    """Move exhausted tasks to 'dead' with their events, tenant by tenant.

    Raises:
        mapped database errors.
    """
    return await _sweep(
        db, "routed_exhausted_tenants", "routed_bury", batch,
        lambda r: ("task.dead", actor, {"attempts": r["attempts"]}),
    )  # fmt: skip


async def expire_deadlines(db: _db.Executor, actor: str, batch: int) -> list[_db.Record]:
    """Move tasks past their deadline to 'dead' with their events, tenant by tenant (G21).

    Raises:
        mapped database errors.
    """
    return await _sweep(
        db, "routed_deadline_tenants", "routed_expire_deadlines", batch,
        lambda r: ("task.deadline_passed", actor, {
            "deadline_at": r["deadline"],
            **({"lease_owner": r["holder"]} if r["holder"] is not None else {}),
        }),
    )  # fmt: skip


async def _sweep(
    db: _db.Executor,
    find: str,
    move: str,
    batch: int,
    event: Callable[[_db.Record], tuple[str, str, dict[str, Any]]],
) -> list[_db.Record]:
    """Statement ``move`` for each tenant ``find`` names, one single-shard transaction
    per tenant, each moved row with its event (type, actor, payload from ``event``)."""
    tenants = [r["tenant_id"] for r in await _db.fetch_many(db, _Q[find], max_tenants=batch)]
    out: list[_db.Record] = []
    for tenant in tenants:
        if len(out) >= batch:
            break
        async with _db.transaction(db) as conn:
            rows = await _db.fetch_many(conn, _Q[move], tenant_id=tenant, batch=batch - len(out))
            events = []
            for r in rows:
                event_type, actor, payload = event(r)
                events.append({
                    "tenant_id": r["tenant_id"], "task_id": r["id"], "event_type": event_type,
                    "actor_id": actor, "policy_version": r["workflow_version"],
                    "from_state": r["from_state"], "to_state": r["state"],
                    "task_state_version": r["state_version"],
                    "payload": document(payload, cap=EVENT_PAYLOAD_CAP, what="event"),
                    "trace_id": r["trace_id"], "span_id": r["span_id"],
                })  # fmt: skip
            await _db.execute_each(conn, _Q["routed_task_event"], events)
        out += rows
    return out


async def create_task(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """``task_create`` on Citus: the INSERT and its event, or the key's holder.

    ``params`` are task_create's. ``None``: as its zero rows (the key's
    holder is not visible yet).

    Raises:
        mapped database errors.
    """
    # wake_after keeps a single-node create's NOTIFY trigger quiet; Citus has none.
    insert = {k: v for k, v in params.items() if k not in ("actor_id", "wake_after")}
    async with _db.transaction(db) as conn:
        row = await _db.fetch_optional(conn, _Q["routed_task_insert"], **insert)
        if row is None:
            return await _db.fetch_optional(
                conn, _Q["routed_task_by_key"], tenant_id=params["tenant_id"],
                dedupe_key=params["dedupe_key"],
            )  # fmt: skip
        created = {
            "tenant_id": row["tenant_id"], "task_id": row["id"],
            "event_type": "task.created", "actor_id": params["actor_id"],
            "policy_version": row["workflow_version"], "from_state": None,
            "to_state": row["state"], "task_state_version": row["state_version"],
            "payload": document({}, cap=EVENT_PAYLOAD_CAP, what="task event"),
            "trace_id": row["trace_id"], "span_id": row["span_id"],
        }  # fmt: skip
        await _db.execute_each(conn, _Q["routed_task_event"], [created])
        return row


async def task_retry(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    expected_version: int,
    actor: str,
    payload: dict[str, Any],
) -> _db.Record | None:
    """``task_retry`` on Citus: the UPDATE, then its ``task.retried`` event, on the
    tenant's worker. ``None``: as task_retry's zero rows.

    Raises:
        mapped database errors.
    """
    async with _db.transaction(db) as conn:
        row = await _db.fetch_optional(
            conn, _Q["routed_task_retry"], tenant_id=tenant_id, id=task_id,
            expected_version=expected_version,
        )  # fmt: skip
        if row is None:
            return None
        retried = {
            "tenant_id": row["tenant_id"], "task_id": row["id"], "event_type": "task.retried",
            "actor_id": actor, "policy_version": row["workflow_version"],
            "from_state": row["from_state"], "to_state": row["state"],
            "task_state_version": row["state_version"],
            "payload": document(
                {**payload, "attempts": row["prior_attempts"]}, cap=EVENT_PAYLOAD_CAP,
                what="reason",
            ),
            "trace_id": row["trace_id"], "span_id": row["span_id"],
        }  # fmt: skip
        await _db.execute_each(conn, _Q["routed_task_event"], [retried])
        return row


async def tenant_create(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> _db.Record | None:
    """``tenant_create`` on Citus: claim the name, then insert the tenant; or the name's tenant.

    The names are unique in ``agent_tenant_names`` there (0013.operator), a
    reference table: the claim and the tenant commit together or not at all.
    A name whose tenant was deleted goes to this create. ``None``: as
    tenant_create's zero rows (the holder changed in between; run it again).

    Raises:
        mapped database errors.
    """
    async with _db.transaction(db) as conn:
        claimed = await _db.fetch_optional(
            conn, _Q["routed_tenant_name_claim"], id=tenant_id, name=name
        )
        if claimed is None:
            holder = await _db.fetch_optional(conn, _Q["routed_tenant_name_holder"], name=name)
            if holder is None:
                return None
            found = await _db.fetch_optional(
                conn, _Q["routed_tenant_by_id"], id=holder["tenant_id"]
            )
            if found is not None:
                return found
            taken = await _db.fetch_optional(
                conn, _Q["routed_tenant_name_take"], name=name, id=tenant_id,
                deleted_id=holder["tenant_id"],
            )  # fmt: skip
            if taken is None:
                return None
        return await _db.fetch_one(conn, _Q["routed_tenant_insert"], id=tenant_id, name=name)


async def transition(
    db: _db.Executor,
    update: dict[str, Any],
    event: dict[str, Any],
    messages: Sequence[dict[str, Any]],
) -> _db.Record | None:
    """``tasks.transition`` on Citus: the UPDATE, its event and its outbox messages, in one
    call that Citus delegates to the tenant's node (agentdb_routed_transition,
    0021.delegated_writes). ``None``: the UPDATE matched nothing.

    ``update``, ``event`` and the messages are task_transition's parameters.

    Raises:
        mapped database errors.
    """
    return await _db.fetch_optional(
        db,
        _Q["routed_transition"],
        **update,
        **event,
        outbox_ids=[m["id"] for m in messages],
        outbox_topics=[m["topic"] for m in messages],
        outbox_payloads=[m["payload"] for m in messages],
    )


async def outbox_claim(
    db: _db.Executor,
    owner: str,
    *,
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> list[_db.Record]:
    """``outbox.claim`` on Citus: due messages tenant by tenant, from the one after
    ``after_tenant``, each tenant's claim routed to its worker.

    Raises:
        mapped database errors.
    """
    query = "routed_outbox_due_tenants"
    tenants, fresh = await _next_tenants(db, query, after_tenant, batch)
    out = await _outbox_walk(db, owner, tenants, batch, visibility)
    if not out and not fresh:  # the ring is behind: as in claim
        tenants, _ = await _next_tenants(db, query, after_tenant, batch, discover=True)
        out = await _outbox_walk(db, owner, tenants, batch, visibility)
    return out


async def _outbox_walk(
    db: _db.Executor, owner: str, tenants: list[uuid.UUID], batch: int, visibility: timedelta
) -> list[_db.Record]:
    out: list[_db.Record] = []
    for tenant in tenants:
        want = batch - len(out)
        if want <= 0:
            break
        rows = await _db.fetch_many(
            db, _Q["routed_outbox_claim"], tenant_id=tenant, lease_owner=owner,
            batch=want, visibility=visibility,
        )  # fmt: skip
        if len(rows) < want:
            _dry(db, "routed_outbox_due_tenants", None, tenant)
        out += rows
    return out


async def outbox_delivered(
    db: _db.Executor,
    tenant_ids: Sequence[uuid.UUID],
    ids: Sequence[uuid.UUID],
    tokens: Sequence[int],
) -> list[_db.Record]:
    """``outbox.mark_delivered`` on Citus: one routed UPDATE per tenant of the batch.

    Raises:
        mapped database errors.
    """
    by_tenant: dict[uuid.UUID, tuple[list[uuid.UUID], list[int]]] = {}
    for tenant, id_, token in zip(tenant_ids, ids, tokens, strict=True):
        mine = by_tenant.setdefault(tenant, ([], []))
        mine[0].append(id_)
        mine[1].append(token)
    out: list[_db.Record] = []
    for tenant, (mine_ids, mine_tokens) in by_tenant.items():
        out += await _db.fetch_many(
            db, _Q["routed_outbox_delivered"], tenant_id=tenant, ids=mine_ids,
            lease_tokens=mine_tokens,
        )  # fmt: skip
    return out


async def outbox_retry(
    db: _db.Executor, tenant_id: uuid.UUID, message_id: uuid.UUID, actor: str
) -> _db.Record | None:
    """``outbox_retry`` on Citus: the UPDATE, then the message's task's
    ``outbox.retried`` event (a message without a task has none), on the
    tenant's worker. ``None``: the message is not there or not dead.

    Raises:
        mapped database errors.
    """
    async with _db.transaction(db) as conn:
        row = await _db.fetch_optional(
            conn, _Q["routed_outbox_retry"], tenant_id=tenant_id, id=message_id
        )
        if row is None or row["task_id"] is None:
            return row
        retried = {
            "tenant_id": row["tenant_id"], "task_id": row["task_id"],
            "event_type": "outbox.retried", "actor_id": actor,
            "policy_version": row["policy_version"], "from_state": None, "to_state": None,
            "task_state_version": None,
            "payload": document(
                {"message_id": str(row["id"]), "topic": row["topic"],
                 "attempts": row["prior_attempts"]},
                cap=EVENT_PAYLOAD_CAP, what="outbox event",
            ),
            "trace_id": row["trace_id"], "span_id": row["span_id"],
        }  # fmt: skip
        await _db.execute_each(conn, _Q["routed_task_event"], [retried])
        return row


async def reserve(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """``operation_reserve`` on Citus: fence, insert or read the key's holder, event.

    ``params`` are operation_reserve's. ``None``: as its zero rows (no such
    task, the lease is not current, or the key's holder vanished in between);
    the caller explains which.

    Raises:
        mapped database errors.
    """
    tenant = params["tenant_id"]
    async with _db.transaction(db) as conn:
        fence = await _db.fetch_optional(
            conn, _Q["routed_operation_fence"], tenant_id=tenant, task_id=params["task_id"],
            lease_owner=params["lease_owner"], lease_token=params["lease_token"],
        )  # fmt: skip
        if fence is not None and not fence["ok"]:
            return None
        if fence is None and params["lease_owner"] is not None:
            return None  # no such task to hold a lease on: the caller says NotFound
        if params.get("units") is not None:
            # Budgets before rate limits (the insert's trigger locks those): the order
            # operation_reserve and a retry's re-arm lock them in.
            await lock_budgets(conn, tenant, params["task_id"], params["units"])
        # No such task in this tenant (and no lease to check): the insert's
        # foreign key refuses it (TenantMismatch), as it does the one-statement form.
        row = await _db.fetch_optional(
            conn, _Q["routed_operation_insert"], tenant_id=tenant, id=params["id"],
            task_id=params["task_id"], idempotency_key=params["idempotency_key"],
            action=params["action"], input_hash=params["input_hash"],
            trace_id=params["trace_id"], span_id=params["span_id"],
        )  # fmt: skip
        if row is None:
            return await _db.fetch_optional(
                conn, _Q["routed_operation_by_key"], tenant_id=tenant,
                idempotency_key=params["idempotency_key"],
            )  # fmt: skip
        if fence is None:  # the task committed after the fence read: reserve again
            raise TransientError("the task appeared while it was being reserved against")
        payload: dict[str, Any] = {
            "action": row["action"], "idempotency_key": row["idempotency_key"],
        }  # fmt: skip
        if params.get("units") is not None:
            await hold(conn, tenant, row["id"], params["task_id"], row["attempts"],
                       params["units"], params["amounts"])  # fmt: skip
            payload["cost"] = dict(zip(params["units"], params["amounts"], strict=True))
        await _db.execute_each(
            conn,
            _Q["routed_operation_event"],
            [_operation_event(row, "operation.reserved", params["actor_id"],
                              fence["workflow_version"], payload)],
        )  # fmt: skip
        return row


async def settle(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """``operation_settle`` on Citus: the UPDATE, then its event. ``None``: its zero rows.

    Raises:
        mapped database errors.
    """
    cost = {k: params[k] for k in ("units", "amounts")}
    update = {
        k: v for k, v in params.items() if k not in ("actor_id", "event_type", *cost)
    }  # fmt: skip
    async with _db.transaction(db) as conn:
        row = await _db.fetch_optional(conn, _Q["routed_operation_settle"], **update)
        if row is None:
            return None
        payload: dict[str, Any] = {"attempts": row["attempts"]}
        if row["provider_reference"] is not None:
            payload["provider_reference"] = row["provider_reference"]
        if row["state"] in ("succeeded", "failed"):
            payload.update(await _settle_holds(conn, row, cost))
        await _db.execute_each(
            conn,
            _Q["routed_operation_event"],
            [_operation_event(row, params["event_type"], params["actor_id"],
                              row["policy_version"], payload)],
        )  # fmt: skip
        return row


async def lock_budgets(
    conn: _db.Executor, tenant: uuid.UUID, task_id: uuid.UUID, units: Sequence[str]
) -> None:
    """Lock the tenant's budgets of ``units`` that cover ``task_id``, in id order (G19),
    inside the caller's transaction: before anything locks a rate limit, and in one
    order for every writer, so no two reservations or re-arms wait for each other.

    Raises:
        mapped database errors.
    """
    await _db.fetch_many(
        conn, _Q["routed_budget_lock"], tenant_id=tenant, task_id=task_id, units=list(units)
    )


async def hold(
    conn: _db.Executor,
    tenant: uuid.UUID,
    operation_id: uuid.UUID,
    task_id: uuid.UUID,
    attempt: int,
    units: Sequence[str],
    amounts: Sequence[int],
) -> list[_db.Record]:
    """Hold ``units``/``amounts`` for one attempt of an operation on the budgets
    covering it (G19), inside the caller's transaction on the tenant's worker.

    Raises:
        BudgetExceeded: a budget would go over its limit (the caller's transaction is lost).
        mapped database errors.
    """
    held = await _db.fetch_many(
        conn, _Q["routed_budget_hold"], tenant_id=tenant, task_id=task_id, units=list(units),
        amounts=list(amounts),
    )  # fmt: skip
    await _db.execute_each(
        conn,
        _Q["routed_budget_hold_row"],
        [
            {"tenant_id": tenant, "operation_id": operation_id, "attempt": attempt,
             "budget_id": h["budget_id"], "unit": h["unit"], "amount": h["amount"]}
            for h in held
        ],
    )  # fmt: skip
    return held


async def hold_retry(
    conn: _db.Executor, op: Operation, costed: dict[str, list[Any] | None]
) -> None:
    """The holds of the next attempt of the failed operation ``op`` (G19), inside the
    caller's transaction (which then re-arms it): its budgets locked in id order
    first, as a reservation locks them.

    Raises:
        BudgetExceeded: a budget has no room (the caller's transaction is lost).
        mapped database errors.
    """
    units, amounts = costed["units"] or [], costed["amounts"] or []
    await lock_budgets(conn, op.tenant_id, op.task_id, units)
    await hold(conn, op.tenant_id, op.id, op.task_id, op.attempts + 1, units, amounts)


async def _settle_holds(
    conn: _db.Executor, row: _db.Record, cost: dict[str, Any]
) -> dict[str, Any]:
    """Settle the holds of an operation that just settled; what its event records."""
    tenant = row["tenant_id"]
    holds = await _db.fetch_many(
        conn, _Q["routed_budget_settle_holds"], tenant_id=tenant, operation_id=row["id"],
        to_state=row["state"], units=cost["units"], amounts=cost["amounts"],
    )  # fmt: skip
    if not holds:
        return {}
    await _db.execute_rows(
        conn, _Q["routed_budget_settle"], tenant_id=tenant,
        budget_ids=[h["budget_id"] for h in holds], amounts=[h["amount"] for h in holds],
        settled=[h["settled"] or 0 for h in holds],
    )  # fmt: skip
    out: dict[str, Any] = {
        "released": {h["unit"]: h["amount"] - (h["settled"] or 0) for h in holds}
    }
    if row["state"] == "succeeded":
        out["spent"] = {h["unit"]: h["settled"] for h in holds}
    return out


def _operation_event(
    row: _db.Record, event_type: str, actor: str, policy: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tenant_id": row["tenant_id"],
        "task_id": row["task_id"],
        "operation_id": row["id"],
        "event_type": event_type,
        "actor_id": actor,
        "policy_version": policy,
        "to_state": row["state"],
        "operation_state_version": row["state_version"],
        "payload": document(payload, cap=EVENT_PAYLOAD_CAP, what="operation event"),
        "trace_id": row["trace_id"],
        "span_id": row["span_id"],
    }


_NOW = datetime.min.replace(tzinfo=UTC)  # greatest(_NOW, now()) is now()


async def release(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """``lease_release`` on Citus: the UPDATE, then its event. ``None``: its zero rows.

    ``params`` are lease_release's (``event_type`` for the event).

    Raises:
        mapped database errors.
    """
    update = {k: v for k, v in params.items() if k != "event_type"}
    if update["wake_at"] is None:
        update["wake_at"] = _NOW
    async with _db.transaction(db) as conn:
        row = await _db.fetch_optional(conn, _Q["routed_release"], **update)
        if row is None:
            return None
        event = {
            "tenant_id": row["tenant_id"], "task_id": row["id"],
            "event_type": params["event_type"], "actor_id": params["lease_owner"],
            "policy_version": row["workflow_version"], "from_state": "running",
            "to_state": row["state"], "task_state_version": row["state_version"],
            "payload": document(
                {"lease_token": params["lease_token"], "attempts": row["attempts"]},
                cap=EVENT_PAYLOAD_CAP, what="release event",
            ),
            "trace_id": row["trace_id"], "span_id": row["span_id"],
        }  # fmt: skip
        await _db.execute_each(conn, _Q["routed_task_event"], [event])
        return row
