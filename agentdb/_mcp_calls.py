"""Is a tool call of the MCP server kit being run by a live server right now? (G13)

:mod:`agentdb.integrations.mcp` holds a Postgres session advisory lock on a
call's key for as long as a server runs the tool body. Postgres drops it with
the session of a server that dies, so the next attempt that takes it knows the
first one is gone and settles the call (reconcile), while an attempt that
cannot take it is told the call is still in flight. The statements live here,
beside their file ``queries/_mcp_calls.sql``, because the integration is an
optional extra and the library reads each statement file from the module of
its name.
"""

from __future__ import annotations

import hashlib
import uuid

from agentdb import _db

__all__ = ["lock_id", "release", "try_hold"]

_Q = _db.queries(__name__)


def lock_id(tenant_id: uuid.UUID, key: str) -> int:
    """The advisory lock's 64-bit id for call ``key`` of a tenant (a digest: keys are text)."""
    digest = hashlib.sha256(f"{tenant_id}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def try_hold(conn: _db.Conn, lock: int) -> bool:
    """Take the lock on this session without waiting; false while another session holds it."""
    return bool((await _db.fetch_one(conn, _Q["mcp_call_lock"], key=lock))["held"])


async def release(conn: _db.Conn, lock: int) -> None:
    """Give the lock back (the call is recorded, or its attempt is over)."""
    await _db.fetch_one(conn, _Q["mcp_call_unlock"], key=lock)
