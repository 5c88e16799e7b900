"""Fault injection for the crash tests: SIGKILL this process at a named step boundary.

Off unless ``AGENTDB_FAULTS`` is set when the process starts, e.g.
``AGENTDB_FAULTS="after_reserve=0.3,after_publish=1"``; then :func:`point`
kills the process with SIGKILL at that boundary with that probability. With
the variable unset, :func:`point` is a function that does nothing - the
normal path pays one call and no lookup.

``AGENTDB_FAULTS_LOG``, if set, names a file that gets one line per kill
(the point's name), written with O_APPEND before the signal, so the chaos
runner can count kills per point.
"""

from __future__ import annotations

import os
import random
import signal

__all__ = ["MEANING", "POINTS", "point"]

#: Every boundary the worker, the relay and the demo provider mark, with what
#: has happened by then (the crash reports quote it).
MEANING = {
    "after_claim": "worker: leases taken, before any handler ran",
    "before_reserve_commit": "worker: reservations queued for one group commit, none written",
    "after_reserve": "worker: the operation's reservation committed, provider not called yet",
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


def _off(name: str) -> None:
    return None


def _on(name: str) -> None:
    chance = _TABLE.get(name)
    if chance is None or random.random() >= chance:
        return
    if _LOG:
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{name}\n".encode())
        finally:
            os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


#: ``point("after_reserve")`` - a no-op unless AGENTDB_FAULTS armed it.
point = _on if _TABLE else _off
