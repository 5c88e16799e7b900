"""Shards moved and a tenant isolated while workers and relays run and are SIGKILLed
(issue 40).

An operator rebalances a cluster that is working: ``citus_move_shard_placement``
copies a shard group to another node and switches over, and
``isolate_tenant_to_new_shard`` splits a busy tenant into shards of its own. Both
with ``shard_transfer_mode => 'block_writes'``: the online mode (logical
replication, Citus's default) never finishes while agentdb's tables take writes -
PostgreSQL refuses to apply replicated changes into a table whose row-level
security applies to the subscription's role ("cannot replicate into relation with
row-level security enabled"), and agentdb forces it on every tenant table, so the
move waits for a catch-up that never comes (seen here: the move ran on for minutes
while the demo finished; cancelled, ``citus_cleanup_orphaned_resources()`` removed
its slot and subscription). Blocking writes, the moving tenants' writes wait for
the copy (about a second here) and go on.

agentdb's per-tenant statements must ride through both - routed to wherever the
tenant's shards are at that instant, its guards (which read the tenant's other
tables on the same node: nested execution) still on one node - with nothing lost
and nothing done twice. The load is ``agentdb demo`` (workers, relays, effects,
approvals, children, schedules and SIGKILLs), whose own report fails on a lost
task, a repeated effect or an undelivered message.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

from tests import _pg
from tests.citus.conftest import Cluster, fresh_database

_BUSIEST = """
SELECT tenant_id FROM agent_tasks WHERE state IN ('pending', 'waiting', 'running')
GROUP BY tenant_id ORDER BY count(*) DESC, tenant_id LIMIT 2
"""
_MOVE = """
SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'block_writes')
"""
_PLACED = """
SELECT s.shardid, s.nodename, s.nodeport
FROM citus_shards s
WHERE s.table_name = 'agent_tenants'::regclass
  AND s.shardid = get_shard_id_for_distribution_column('agent_tenants', %s)
"""


def _count(dsn: str, sql: str) -> int:
    try:
        with _pg.admin(dsn) as conn:
            row = conn.execute(sql).fetchone()
    except psycopg.Error:  # not migrated yet
        return 0
    return int(row[0]) if row else 0


@pytest.mark.timeout(900)  # the demo's own limit is 420 s; moves wait for its writes
def test_shards_moved_and_a_tenant_isolated_under_load_lose_nothing(citus: Cluster) -> None:
    """While the demo runs (4 tenants, 3 workers, 2 relays, a SIGKILL every 2 s on
    average): the busiest tenant's shard group moves to the other node, the
    second busiest is isolated into shards of its own, and its new shard moves too.
    The demo's report must say every effect once, every message delivered, nothing lost
    or stuck; and the moves must have happened while work was left."""
    with fresh_database(citus.dsn, "agentdb_mv") as fresh:
        demo = subprocess.Popen(
            [
                sys.executable, "-m", "agentdb", "demo", "--dsn", fresh.dsn, "--tasks", "160",
                "--tenants", "4", "--workers", "3", "--relays", "2", "--kill-every", "2",
                "--timeout", "420", "--seed", "40",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while _count(fresh.dsn, "SELECT count(*) FROM agent_events WHERE event_type = "
                         "'task.succeeded'") < 15:  # fmt: skip
                assert demo.poll() is None, demo.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "the demo did not get going"
                time.sleep(0.5)
            nodes = {(h, p) for h, p in ((w.rsplit("@", 1)[-1].split("/")[0].rsplit(":", 1))
                                          for w in fresh.workers)}  # fmt: skip
            with _pg.admin(fresh.dsn) as conn:
                busiest = [r[0] for r in conn.execute(_BUSIEST).fetchall()]
                assert len(busiest) == 2, busiest
                moved = []
                # 1. The busiest tenant's shard group to the other node.
                shard, host, port = conn.execute(_PLACED, (busiest[0],)).fetchone() or (0, "", 0)
                (to_host, to_port) = next(n for n in nodes if n != (host, str(port)))
                conn.execute(_MOVE, (shard, host, port, to_host, int(to_port)))
                moved.append(conn.execute(_PLACED, (busiest[0],)).fetchone())
                # 2. The second busiest isolated into shards of its own.
                conn.execute(
                    "SELECT isolate_tenant_to_new_shard('agent_tenants', %s, 'CASCADE',"
                    " shard_transfer_mode => 'block_writes')",
                    (busiest[1],),
                )
                isolated = conn.execute(_PLACED, (busiest[1],)).fetchone()
                assert isolated is not None
                # 3. And its new shard group moved.
                (to_host, to_port) = next(n for n in nodes if n != (isolated[1], str(isolated[2])))
                conn.execute(_MOVE, (isolated[0], isolated[1], isolated[2], to_host, int(to_port)))
                moved.append(conn.execute(_PLACED, (busiest[1],)).fetchone())
                left = conn.execute(
                    "SELECT count(*) FROM agent_tasks"
                    " WHERE state IN ('pending', 'waiting', 'running')"
                ).fetchone()
            assert moved[0] is not None
            assert (moved[0][1], str(moved[0][2])) != (host, str(port))
            assert moved[1] is not None
            assert moved[1][0] == isolated[0]
            assert left is not None
            assert left[0] > 0  # the moves ran while work was left
            out, _ = demo.communicate(timeout=480)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.communicate()
            with _pg.admin(fresh.dsn) as conn:  # a failed move's slot would keep the database
                conn.execute("CALL citus_cleanup_orphaned_resources()")
        assert demo.returncode == 0, out[-4000:]
        assert "\nOK: every effect once" in out, out[-4000:]
