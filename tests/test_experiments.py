"""dev/experiments/watermark_claim.py: the prototype claim still runs on the schema.

The prototype (issue 41, item 3) is a measurement, not the library: this keeps its
statement valid as the schema moves on, and pins the one rule its figures rest on -
the watermark claim starts at a pair's watermark and leaves what lies below it to the
full walk (``leases.claim``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from agentdb import leases, tasks
from dev.experiments.watermark_claim import claim_watermark
from tests.conftest import Tenants


async def test_the_watermark_claim_starts_at_the_mark_and_the_full_walk_takes_the_rest(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    now = datetime.now(UTC)
    below = await tasks.create(pool, tenants.a, "wm", wake_at=now - timedelta(minutes=10))
    above = await tasks.create(pool, tenants.a, "wm", wake_at=now - timedelta(minutes=1))
    marks = {(tenants.a, "wm"): now - timedelta(minutes=5)}
    async with pool.acquire() as conn:
        got = await claim_watermark(
            conn, "w", marks, batch=10, lease_ttl=None, task_types=["wm"], after_tenant=None
        )
        assert [t.id for t in got] == [above.id]
        # Nothing else of the pair at or past the mark: the claim comes back empty.
        again = await claim_watermark(
            conn, "w", marks, batch=10, lease_ttl=None, task_types=["wm"], after_tenant=None
        )
        assert again == []
    # The control: the current statement (the periodic full walk) takes the task below.
    assert [t.id for t in await leases.claim(pool, "w", batch=10, task_types=["wm"])] == [below.id]
