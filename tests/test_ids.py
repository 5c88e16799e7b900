"""Row ids sort by when they were made (UUIDv7), in Python and in the database alike.

Why: ``agentdb/_ids.py`` (the WAL's full-page images on indexes by id, issue 41).
What must not change: 74 random bits per id (task ids are bearer tokens to the
MCP kit), and a tenant's id stays random.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from agentdb import operations, outbox, signals, tasks
from agentdb._ids import new_id
from agentdb.models import Message
from tests.conftest import Tenants


def _millis(value: uuid.UUID) -> int:
    return value.int >> 80


def test_a_new_id_is_a_version_7_uuid_of_the_millisecond_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    assert before <= _millis(made) <= after


@pytest.mark.parametrize(
    ("now_ns", "millis"),
    [
        (1_733_000_000_123_456_789, 1_733_000_000_123),  # an odd millisecond keeps its last bit
        ((2**48 - 1) * 1_000_000, 2**48 - 1),  # the last millisecond of the 48-bit clock
        ((2**48 + 5) * 1_000_000, 5),  # year 10889: the clock wraps, the id stays a UUID
    ],
)
def test_a_new_id_holds_exactly_the_48_bits_of_its_millisecond(
    monkeypatch: pytest.MonkeyPatch, now_ns: int, millis: int
) -> None:
    """Kills mutmut's new_id mutants 6-9 (the 48-bit mask widened, dropped or short a bit)."""
    monkeypatch.setattr(time, "time_ns", lambda: now_ns)
    made = new_id()
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    assert _millis(made) == millis


def test_ids_of_later_milliseconds_sort_after_and_each_keeps_its_random_bits() -> None:
    first = new_id()
    time.sleep(0.002)
    later = new_id()
    assert later > first
    batch = [new_id() for _ in range(20_000)]
    random_bits = {i.int & ((1 << 74) - 1) | (i.int >> 64 & 0xFFF) << 74 for i in batch}
    assert len(random_bits) == len(batch)  # 74 random bits each: no two alike
    # Each random bit varies (a bit stuck at 0 or 1 would halve the guessing space).
    for bit in (*range(62), *range(64, 76)):
        assert 0 < sum(i.int >> bit & 1 for i in batch) < len(batch), bit


async def test_the_database_default_is_the_same_kind_of_id(pool: asyncpg.Pool) -> None:
    made: uuid.UUID = await pool.fetchval("SELECT agentdb_new_id()")
    now = int(datetime.now(UTC).timestamp() * 1000)
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    assert abs(_millis(made) - now) < 60_000
    defaults: dict[str, str] = dict(
        await pool.fetch(  # type: ignore[arg-type]
            "SELECT table_name, column_default FROM information_schema.columns"
            " WHERE column_name = 'id' AND table_name LIKE 'agent\\_%' AND column_default"
            " LIKE '%(%'"
        )
    )
    assert defaults.pop("agent_tenants") == "gen_random_uuid()"  # what Citus distributes by
    assert defaults.pop("agent_events").startswith("nextval(")  # a sequence: in order already
    assert set(defaults.values()) == {"agentdb_new_id()"}, defaults
    assert {"agent_tasks", "agent_operations", "agent_outbox", "agent_signals"} <= set(defaults)


async def test_the_rows_the_runtime_makes_have_time_ordered_ids(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "ids.probe", waiting=True)
    res = await operations.reserve(pool, tenants.a, task.id, "ids/1", "probe", {})
    sig = await signals.signal(pool, tenants.a, task.id, "go", {})
    async with pool.acquire() as conn, conn.transaction():
        msg = await outbox.enqueue(conn, tenants.a, "ids.topic", task_id=task.id)
    for made in (task.id, res.operation.id, sig.id, msg, Message("ids.topic").id):
        assert made.version == 7, made
    assert tenants.a.version == 4  # a tenant's id is random
