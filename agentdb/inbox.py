"""Inbox: process each delivered message at most once per consumer (G11).

The relay delivers at least once. A consumer records the message id in
``agent_inbox`` in the same transaction as its own effect; a redelivery finds
the id already there and skips the effect.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentdb import _db

__all__ = ["process_once", "record"]

T = TypeVar("T")
_Q = _db.queries(__name__)


async def record(
    conn: _db.Conn, tenant_id: uuid.UUID, consumer: str, message_id: uuid.UUID
) -> bool:
    """Record ``message_id`` for ``consumer`` in the caller's transaction.

    Returns true the first time (go ahead), false for a redelivery (skip).
    """
    touched = await _db.execute_rows(
        conn, _Q["inbox_record"], tenant_id=tenant_id, consumer=consumer, message_id=message_id
    )
    return touched == 1


async def process_once(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    consumer: str,
    message_id: uuid.UUID,
    handler: Callable[[_db.Conn], Awaitable[T]],
) -> tuple[bool, T | None]:
    """Run ``handler(conn)`` once per (consumer, message) in one transaction with the inbox row.

    Returns ``(True, handler's result)`` the first time and ``(False, None)``
    for a redelivery. If the handler raises, nothing is recorded and the
    message can be processed again.
    """
    async with _db.transaction(db) as conn:
        if not await record(conn, tenant_id, consumer, message_id):
            return False, None
        return True, await handler(conn)
