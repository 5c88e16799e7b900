"""Fault injection for the crash tests: SIGKILL this process at a named step boundary.

Off unless ``AGENTDB_FAULTS`` is set when the process starts, e.g.
``AGENTDB_FAULTS="after_reserve=0.3,after_publish=1"``; then :func:`point`
kills the process with SIGKILL at that boundary with that probability. With
the variable unset, :func:`point` is a function that does nothing - the
normal path pays one call and no lookup.

``AGENTDB_FAULTS_LOG``, if set, names a file that gets one line per kill
(the point's name), written with O_APPEND before the signal, so the chaos
runner can count kills per point. ``AGENTDB_FAULTS_TRACE``, if set, names a
file that gets one line per point *passed* (killed or not): the crash test
kit reads it from a run without faults to learn which points a handler
reaches, so it crashes at each of those and at no other.

:func:`inside` runs an awaitable with a point armed *while it runs*: the
point fires once the awaitable has started (sent its request) and before it
returned - a crash in the middle of a step's or an effect's call.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["ARMED", "MEANING", "POINTS", "inside", "point"]

#: Every boundary the worker, the relay and the demo provider mark, with what
#: has happened by then (the crash reports quote it).
MEANING = {
    "after_claim": "worker: leases taken, before any handler ran",
    "before_reserve_commit": "worker: reservations queued for one group commit, none written",
    "after_reserve": "worker: the operation's reservation committed, provider not called yet",
    "during_step": "worker: a step's function is running, its result not yet recorded",
    "during_effect": "worker: an effect's function is running (its reservation committed)",
    "during_call": "provider: request received, effect not yet recorded",
    "after_call": "worker: the provider succeeded, outcome not yet recorded",
    "after_complete": "worker: operation recorded, task not finished",
    "before_group_commit": "worker: successes queued for one group commit, none written",
    "after_transition": "worker: task finished and outbox row committed, not yet published",
    "after_relay_claim": "relay: rows claimed, nothing published",
    "after_publish": "relay: published, not yet marked delivered",
}
POINTS = tuple(MEANING)


def _parse(spec: str) -> dict[str, float]:
    table: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, prob = item.partition("=")
        if name not in POINTS:
            raise ValueError(
                f"AGENTDB_FAULTS: unknown fault point {name!r}; known: {', '.join(POINTS)}"
            )
        table[name] = float(prob or "1")
    return table


_TABLE = _parse(os.environ.get("AGENTDB_FAULTS", ""))
_LOG = os.environ.get("AGENTDB_FAULTS_LOG")
_TRACE = os.environ.get("AGENTDB_FAULTS_TRACE")
#: Faults (or the trace) are on in this process: :func:`inside` pays for its task only then.
ARMED = bool(_TABLE or _TRACE)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _off(name: str) -> None:
    return None


def _on(name: str) -> None:
    if _TRACE:
        _append(_TRACE, name)
    chance = _TABLE.get(name)
    if chance is None or random.random() >= chance:
        return
    if _LOG:
        _append(_LOG, name)
    os.kill(os.getpid(), signal.SIGKILL)


#: ``point("after_reserve")`` - a no-op unless AGENTDB_FAULTS (or the trace) armed it.
point = _on if ARMED else _off

_T = TypeVar("_T")


async def inside(name: str, work: Awaitable[_T]) -> _T:
    """Await ``work`` - with point ``name`` passed once it has started and not yet returned."""
    if not ARMED:
        return await work
    running = asyncio.ensure_future(work)
    await asyncio.sleep(0)  # it runs up to its first await: the request is on its way
    point(name)  # (or it is done already: then this is between its call and its record)
    return await running
