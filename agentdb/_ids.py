"""Row ids that sort by creation time: UUIDv7 (RFC 9562).

Every index on a task, operation, message or signal leads with the tenant and
then an id (or a key that starts with one: an effect's idempotency key is its
task's id and name). With random (v4) ids each new row lands on another leaf
page of each of those indexes, and the first change to a page after a
checkpoint writes the whole page to the WAL: a unit of work paid several
full-page images for ever on every index (issue 41 measured 6.3 kB of its 14.5
kB). A v7 id starts with the millisecond it was made, so a tenant's new rows
go to the right edge of its range of each index - the same few pages - and
those pages are imaged once per checkpoint, not once per row.

What stays: 74 random bits per id (a task id is still a bearer token nobody
can guess: the MCP Tasks extension's rule), and ids are still made by the
client, before the insert, so a retried create names the same row. What it
gives away: the id tells when the row was made, to the millisecond - which
its ``created_at`` says anyway to whoever may read the row. The database's
own defaults make the same ids (``agentdb_new_id()``, migration
``0015.time_ordered_ids``).
"""

from __future__ import annotations

import os
import time
import uuid

_VERSION = 0x7 << 76  # bits 76-79 of the 128: the version nibble
_VARIANT = 0x2 << 62  # bits 62-63: the RFC 9562 variant, 0b10
_CLEAR = ~((0xF << 76) | (0x3 << 62))


def new_id() -> uuid.UUID:
    """A new UUIDv7: 48 bits of Unix milliseconds, then 74 random bits."""
    millis = time.time_ns() // 1_000_000 & ((1 << 48) - 1)
    value = millis << 80 | int.from_bytes(os.urandom(10), "big")
    return uuid.UUID(int=value & _CLEAR | _VERSION | _VARIANT)
