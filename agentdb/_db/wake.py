"""Wake LISTENers after a commit, one NOTIFY for a burst of commits.

PostgreSQL serialises the commits of every transaction that has sent a
NOTIFY, across the whole server: ``PreCommit_Notify`` takes one lock before
the commit record is written and holds it until the record is flushed, so
that notifications reach the queue in commit order. Such transactions get no
group commit. A producer creating tasks from many coroutines was therefore
held to one create per WAL flush, and every worker's commit that notified
queued behind the same lock (``docs/benchmarks.md``, section 7).

So a statement the runtime commits by itself - on a pool, or on a connection
outside any transaction (:func:`commits_alone`) - sets ``agentdb.wake`` to
``'after_commit'`` for its own transaction, which keeps the NOTIFY triggers
quiet (``0017.wake_after_commit``), and the caller then awaits :func:`wake_listeners`.
On a pool one NOTIFY is in flight at a time per channel: a caller whose commit
came while one was in flight waits for the next, which starts after its
commit, so a listener woken by it sees the caller's row. A burst of creates
shares one NOTIFY; their commits group-commit.

A wake is a hint no guarantee rests on (listeners poll too): a wake that fails
is logged, never raised, since the caller's commit has already happened.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg

from agentdb._db.execute import Executor, is_pool
from agentdb._db.sqlfile import Query

__all__ = ["PAYLOAD", "commits_alone", "wake_listeners"]

_log = logging.getLogger("agentdb.wake")

#: The payload of the runtime's own wake (a trigger's NOTIFY carries ``''``):
#: listeners read neither, but the two can be told apart.
PAYLOAD = "after_commit"


def commits_alone(db: Executor) -> bool:
    """Whether a statement on ``db`` is its own transaction (commits when it ends)."""
    return isinstance(db, asyncpg.Pool) or not db.is_in_transaction()


@dataclass
class _Channel:
    """One pool's wakes on one channel: the one in flight, and the one queued after it."""

    running: asyncio.Future[None] | None = None
    queued: asyncio.Future[None] | None = None
    sends: set[asyncio.Task[None]] = field(default_factory=set)


# Keyed by id(): asyncpg's Pool takes no weak reference (__slots__). An entry
# lives only while a wake is in flight, and its task holds the pool alive, so
# an id is never reused under a live entry.
_channels: dict[tuple[int, str], _Channel] = {}


async def wake_listeners(db: Executor, notify: Query, channel: str) -> None:
    """NOTIFY ``channel`` (statement ``notify``: ``$1`` channel, ``$2`` payload) once
    the caller's commit is visible; on a pool, shared with the callers around it."""
    if not is_pool(db):
        # A connection runs one statement at a time, and this caller holds it.
        await _send(db, notify, channel)
        return
    key = (id(db), channel)
    ch = _channels.setdefault(key, _Channel())
    mine = ch.queued
    if mine is None:
        mine = ch.queued = asyncio.get_running_loop().create_future()
        if ch.running is None:
            _start(db, notify, channel, key, ch)
    # Shielded: a caller cancelled while it waits leaves the NOTIFY to the others.
    await asyncio.shield(mine)


def _start(db: Executor, notify: Query, channel: str, key: tuple[int, str], ch: _Channel) -> None:
    ch.running, ch.queued = ch.queued, None
    task = asyncio.ensure_future(_run(db, notify, channel, key, ch))
    ch.sends.add(task)
    task.add_done_callback(ch.sends.discard)


async def _run(
    db: Executor, notify: Query, channel: str, key: tuple[int, str], ch: _Channel
) -> None:
    try:
        await _send(db, notify, channel)
    finally:
        done = ch.running
        if done is not None and not done.done():
            done.set_result(None)
        ch.running = None
        if ch.queued is not None:
            _start(db, notify, channel, key, ch)
        else:
            _channels.pop(key, None)


async def _send(db: Executor, notify: Query, channel: str) -> None:
    try:
        await db.execute(notify.sql, channel, PAYLOAD)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        # The commit it follows stands; the listeners' polling finds the row.
        _log.warning("agentdb: could not wake the listeners of %s: %s", channel, exc)
