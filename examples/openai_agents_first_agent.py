import asyncio

from agents import Agent, function_tool

from agentdb import create_pool, tasks, tenancy, testing, worker
from agentdb.integrations.openai_agents import AgentdbRunner, OfflineModel, current_idempotency_key
from agentdb.tools.embedded import embedded_postgres


async def refund(order: str, amount: int) -> str:  # a tool: runs once per call, whatever crashes
    return f"refunded {amount} on {order}, key {current_idempotency_key()}"  # the provider's


offline = OfflineModel.calling("refund", order="A-17", amount=42)  # no API key, no network
agent = Agent(name="support", tools=[function_tool(refund)], model=offline)


async def support(job: worker.Job) -> worker.Succeed:  # a task handler runs the agent
    result = await AgentdbRunner.run(agent, "Refund order A-17")  # was: Runner.run
    return worker.Succeed(payload={"answer": result.final_output})


async def main(dsn: str) -> None:
    async with await create_pool(dsn) as pool:
        await tasks.create(pool, await tenancy.create_tenant(pool, "acme"), "support")
        print(await testing.drain(pool, {"support": support}))  # a worker, until nothing is due


with embedded_postgres() as dsn:  # a private Postgres, migrated: nothing to install
    asyncio.run(main(dsn))
