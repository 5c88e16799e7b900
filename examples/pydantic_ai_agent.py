import asyncio

from pydantic_ai import Agent

from agentdb import create_pool, tasks, tenancy, worker
from agentdb.integrations.pydantic_ai import AgentdbDurability, idempotency_key
from agentdb.testing import drain
from agentdb.tools.embedded import embedded_postgres

agent = Agent("test", name="support", capabilities=[AgentdbDurability()])  # "test": offline


@agent.tool_plain
async def refund(order: str, amount: int) -> str:  # runs once per call, whatever crashes
    return f"refunded {amount} on {order}, key {idempotency_key()}"  # the provider's key


async def support(job: worker.Job) -> worker.Succeed:  # a task handler runs the agent
    return worker.Succeed(payload={"answer": (await agent.run(job.task.params["ask"])).output})


async def main(dsn: str) -> None:
    async with await create_pool(dsn) as pool:
        tenant = await tenancy.create_tenant(pool, "acme")
        await tasks.create(pool, tenant, "support", params={"ask": "Refund order A-17"})
        print(await drain(pool, {"support": support}))  # a worker, until nothing is due


with embedded_postgres() as dsn:  # a private Postgres, migrated: nothing to install
    asyncio.run(main(dsn))
