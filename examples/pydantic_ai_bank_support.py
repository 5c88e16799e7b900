"""Pydantic AI's bank support example, run on agentdb: the framework's own code, unchanged
but for the agent's model (offline) and the line that makes it durable.

Source: https://ai.pydantic.dev/examples/bank-support/ (``pydantic_ai_examples.bank_support``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.test import TestModel

from agentdb.integrations.pydantic_ai import AgentdbDurability
from agentdb.worker import Job, Succeed


class DatabaseConn:
    """This is a fake database for example purposes.

    In reality, you'd be connecting to an external database
    (e.g. PostgreSQL) to get information about customers.
    """

    @classmethod
    async def customer_name(cls, *, id: int) -> str | None:
        if id == 123:
            return "John"
        return None

    @classmethod
    async def customer_balance(cls, *, id: int, include_pending: bool) -> float:
        if id == 123:
            if include_pending:
                return 123.45
            else:
                return 100.00
        else:
            raise ValueError("Customer not found")


@dataclass
class SupportDependencies:
    customer_id: int
    db: DatabaseConn


class SupportOutput(BaseModel):
    support_advice: str
    """Advice returned to the customer"""
    block_card: bool
    """Whether to block their card or not"""
    risk: int
    """Risk level of query"""


support_agent = Agent(
    TestModel(),  # the example's 'openai:gpt-4o', offline
    deps_type=SupportDependencies,
    output_type=SupportOutput,
    instructions=(
        "You are a support agent in our bank, give the "
        "customer support and judge the risk level of their query. "
        "Reply using the customer's name."
    ),
    name="support_agent",  # agentdb: the name every step of its runs carries
    capabilities=[AgentdbDurability()],  # agentdb: the wrapper line
)


@support_agent.instructions
async def add_customer_name(ctx: RunContext[SupportDependencies]) -> str:
    customer_name = await ctx.deps.db.customer_name(id=ctx.deps.customer_id)
    return f"The customer's name is {customer_name!r}"


@support_agent.tool
async def customer_balance(ctx: RunContext[SupportDependencies], include_pending: bool) -> str:
    """Returns the customer's current account balance."""
    balance = await ctx.deps.db.customer_balance(
        id=ctx.deps.customer_id,
        include_pending=include_pending,
    )
    return f"${balance:.2f}"


async def bank_support(job: Job) -> Succeed:
    """The example's ``main``, as an agentdb task handler: one question per task."""
    deps = SupportDependencies(customer_id=job.task.params["customer_id"], db=DatabaseConn())
    result = await support_agent.run(job.task.params["question"], deps=deps)
    return Succeed(payload=result.output.model_dump())
