"""Workers and relays pointed at a Citus worker node instead of the coordinator (issue 40).

Since Citus 11 the metadata is synced to every node, so a router statement can be
sent to any of them: a worker or relay connected to a worker node runs its
tenants' statements there (on that node's own shards without a hop at all), and
the coordinator sees none of it. ``agentdb status`` on the coordinator lists
each of them with the node it runs on (citus_stat_activity).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg

from agentdb import _db, status, tasks, tenancy
from agentdb.models import Message
from agentdb.relay import Relay
from agentdb.worker import Job, Succeed, Worker
from tests.citus.conftest import Cluster

_NODE_OF = """
SELECT p.nodeport FROM pg_dist_placement pl JOIN pg_dist_node p ON p.groupid = pl.groupid
WHERE pl.shardid = get_shard_id_for_distribution_column('agent_tenants', $1::uuid)
"""


def _port(url: str) -> int:
    return int(url.rsplit("@", 1)[-1].split("/", 1)[0].rsplit(":", 1)[1])


async def test_a_worker_and_a_relay_on_worker_nodes_drain_the_cluster(
    citus: Cluster, conn: asyncpg.Connection
) -> None:
    """Eighteen tasks of six tenants (their shards on both worker nodes), each finishing
    with an outbox message: a worker connected to one worker node and a relay connected
    to the other finish and publish every one of them exactly once, and the coordinator's
    status names each with its node."""
    # Three tenants on each worker node (a tenant lands by the hash of its id: new ones
    # until each node holds three).
    by_node: dict[int, list[uuid.UUID]] = {}
    while len(by_node) < 2 or min(len(v) for v in by_node.values()) < 3:
        t = await tenancy.create_tenant(conn, f"ct-{uuid.uuid4().hex[:8]}")
        by_node.setdefault(await conn.fetchval(_NODE_OF, t), []).append(t)
        assert sum(len(v) for v in by_node.values()) < 200
    ids = [t for v in by_node.values() for t in v[:3]]
    made = [await tasks.create(conn, ids[i % 6], "on-node", params={"n": i}) for i in range(18)]

    async def job(j: Job) -> Succeed:
        return Succeed(outbox=(Message("done", {"n": j.task.params["n"]}),))

    published: list[Any] = []

    async def publish(message: Any) -> None:
        published.append(message.payload["n"])

    on_worker, on_relay = citus.workers[0], citus.workers[1]
    wpool = await _db.create_pool(on_worker, max_size=4, application_name="agentdb worker w-node")
    rpool = await _db.create_pool(on_relay, max_size=2, application_name="agentdb relay r-node")
    worker = Worker(wpool, {"on-node": job}, worker_id="w-node", poll_interval=0.1)
    relay = Relay(rpool, publish, relay_id="r-node", poll_interval=0.1)
    running = [
        asyncio.create_task(worker.run(install_signals=False)),
        asyncio.create_task(relay.run(install_signals=False)),
    ]
    try:
        seen: list[status.Process] = []
        for _ in range(600):
            await asyncio.sleep(0.1)
            if not seen:
                seen = [p for p in (await status.snapshot(conn)).processes
                        if p.owner in ("w-node", "r-node")]  # fmt: skip
            if len(published) >= 18:
                break
        done = await conn.fetchval(
            "SELECT count(*) FROM agent_tasks WHERE id = ANY ($1::uuid[]) AND state = 'succeeded'",
            [t.id for t in made],
        )
        assert done == 18
        assert sorted(published) == list(range(18))  # each once
        by_owner = {p.owner: p for p in seen}
        assert by_owner["w-node"].kind == "worker"
        assert by_owner["w-node"].node.endswith(f":{_port(on_worker)}")
        assert by_owner["r-node"].kind == "relay"
        assert by_owner["r-node"].node.endswith(f":{_port(on_relay)}")
        # Claimed on a worker node: the claims' events name this worker.
        owners = await conn.fetch(
            "SELECT DISTINCT actor_id FROM agent_events WHERE task_id = ANY ($1::uuid[])"
            " AND event_type = 'task.claimed'",
            [t.id for t in made],
        )
        assert [r["actor_id"] for r in owners] == ["w-node"]
    finally:
        worker.stop()
        relay.stop()
        await asyncio.gather(*running, return_exceptions=True)
        await wpool.close()
        await rpool.close()
