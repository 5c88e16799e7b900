"""Single-node or routed: the one place the runtime chooses, once per pool or connection.

A write the plain runtime makes in one statement (a claim, a transition, a
reservation with its event) cannot be routed by Citus: it plans an INSERT
inside a WITH through the coordinator and commits it with two-phase commit.
On a distributed schema the runtime runs a routed twin instead - per tenant,
an UPDATE then single-row inserts, one worker, one-phase commit
(:mod:`agentdb._citus.routed`). Each such write is a pair of functions with
one signature: the single-node form, in its domain module beside its
statement, decorated with :func:`twin` naming its routed form. Callers call
the single-node form; :func:`twin` runs the routed one instead when
:func:`distributed` says so. :data:`TWINS` lists every pair (the tests hold
each routed statement against its single-node twin).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from agentdb import _db

__all__ = ["TWINS", "distributed", "twin"]

_Q = _db.queries(__name__)
P = ParamSpec("P")
R = TypeVar("R")
Form = Callable[Concatenate[Any, P], Awaitable[R]]

#: Every pair: the single-node form's qualified name -> (single-node form, routed form).
TWINS: dict[str, tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]]] = {}

# Per raw connection: a pooled proxy is new on every acquire, its connection is not.
_DISTRIBUTED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# Per pool (asyncpg pools take no weak reference): the entry holds the pool,
# so its id cannot be reused while the entry lives; the oldest entries go.
_POOLS: OrderedDict[int, tuple[_db.Pool, bool]] = OrderedDict()
_POOLS_KEPT = 64


async def distributed(db: _db.Executor) -> bool:
    """Whether ``db``'s schema is distributed by Citus (asked once per connection or pool).

    On Citus the runtime runs per-tenant statements that each route to one
    worker, so one task's work commits there without two-phase commit.

    Raises:
        mapped database errors other than a schema without
        ``agentdb_distributed()`` (one not migrated yet: not distributed).
    """
    if _db.is_pool(db):
        kept = _POOLS.get(id(db))
        if kept is not None and kept[0] is db:
            return kept[1]
        async with db.acquire() as conn:
            answer = await distributed(conn)
        _POOLS[id(db)] = (db, answer)
        while len(_POOLS) > _POOLS_KEPT:
            _POOLS.popitem(last=False)
        return answer
    raw = _db.raw_connection(cast("_db.Conn", db))  # not a pool: handled above
    known = _DISTRIBUTED.get(raw)
    if known is None:
        try:
            row = await _db.fetch_one(db, _Q["routing_distributed"])
            known = bool(row["distributed"])
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42883":  # undefined_function
                raise
            known = False
        _DISTRIBUTED[raw] = known
    return known


def twin(routed: Form[P, R]) -> Callable[[Form[P, R]], Form[P, R]]:
    """Decorate a single-node form: on a distributed schema ``routed`` runs instead.

    Both take the executor first and the same arguments after it (mypy holds
    the signatures together); the choice is :func:`distributed`'s, made once
    per pool or connection.
    """

    def pair(single: Form[P, R]) -> Form[P, R]:
        @functools.wraps(single)
        async def either(db: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            form = routed if await distributed(db) else single
            return await form(db, *args, **kwargs)

        TWINS[f"{single.__module__}.{single.__qualname__}"] = (single, routed)
        return either

    return pair
