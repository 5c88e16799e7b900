"""Events by month on a distributed schema, converted in place both ways (G8, G9).

A distributed install that holds events is converted (the partitioned table
distributed like the one it replaces, the old one attached as its legacy
partition), rolled back (one distributed table again, every row kept) and
converted again; then the month rotation runs through the coordinator and a
second event for one version is refused across partitions.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from agentdb import migrate
from tests import _pg
from tests.citus.conftest import Cluster, fresh_database

_ROWS = (
    "SELECT id, tenant_id, task_id, task_state_version, created_at FROM agent_events ORDER BY id"
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _distributed(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT logicalrelid::text FROM pg_dist_partition"
        " WHERE logicalrelid::text LIKE 'agent\\_events%'"
    ).fetchall()
    return {str(r[0]) for r in rows}


def _seed(conn: psycopg.Connection[Any], tenants: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    made = []
    for n in range(tenants):
        [(tenant,)] = conn.execute(
            "INSERT INTO agent_tenants (name) VALUES (%s) RETURNING id", (f"t{n}",)
        ).fetchall()
        with conn.transaction():
            [(task,)] = conn.execute(
                "INSERT INTO agent_tasks (tenant_id, task_type, workflow_version)"
                " VALUES (%s, 'x', 'v1') RETURNING id",
                (tenant,),
            ).fetchall()
            conn.execute(
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version, task_state_version, to_state)"
                " VALUES (%s, %s, 'task.created', 't', 'p', 0, 'pending')",
                (tenant, task),
            )
        conn.execute(
            "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version)"
            " SELECT %s, %s, 'note', 't', 'p' FROM generate_series(1, 5)",
            (tenant, task),
        )
        made.append((tenant, task))
    return made


def test_a_distributed_install_holding_events_converts_both_ways(citus: Cluster) -> None:
    with fresh_database(citus.dsn, "agentdb_ev") as fresh:
        up = _cli("migrate", "--citus", "--dsn", fresh.dsn)
        assert up.returncode == 0, up.stderr
        with _pg.admin(fresh.dsn) as conn:
            assert _distributed(conn) == {"agent_events"}
            made = _seed(conn, 4)
            before = conn.execute(_ROWS).fetchall()
        by_month = _cli("migrate", "--events-by-month", "--dsn", fresh.dsn)
        assert by_month.returncode == 0, by_month.stderr
        with _pg.admin(fresh.dsn) as conn:
            assert conn.execute(_ROWS).fetchall() == before
            assert {"agent_events", "agent_events_legacy", "agent_events_default"} <= _distributed(
                conn
            )
        # Back to 0010.access: the newest migrations down to 0011.retention (its
        # rollback unpartitions); applied again, 0012.citus distributes what they remade.
        ids = migrate.migration_ids()
        count = str(len(ids) - ids.index("0011.retention"))
        down = _cli("rollback", "--count", count, "--dsn", fresh.dsn)
        assert down.returncode == 0, down.stderr
        with _pg.admin(fresh.dsn) as conn:
            assert _distributed(conn) == {"agent_events"}
            assert conn.execute(_ROWS).fetchall() == before
            tenant, task = made[0]
            with pytest.raises(psycopg.errors.UniqueViolation):  # one table's unique key is back
                conn.execute(
                    "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                    " policy_version, task_state_version) VALUES (%s, %s, 'forged', 't', 'p', 0)",
                    (tenant, task),
                )
        again = _cli("migrate", "--events-by-month", "--dsn", fresh.dsn)
        assert again.returncode == 0, again.stderr
        with _pg.admin(fresh.dsn) as conn:
            assert conn.execute(_ROWS).fetchall() == before
            assert {"agent_events", "agent_events_legacy", "agent_events_default"} <= _distributed(
                conn
            )
            month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            later = (month + timedelta(days=62)).replace(day=1)
            rotated = conn.execute("SELECT * FROM agentdb_event_partitions(3)").fetchall()
            assert rotated == [
                (f"agent_events_p{(later + timedelta(days=32)):%Y_%m}", "created", 0)
            ]
            for tenant, task in made:
                with pytest.raises(psycopg.errors.UniqueViolation, match="task_version_key"):
                    conn.execute(
                        "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                        " policy_version, task_state_version, created_at)"
                        " VALUES (%s, %s, 'forged', 't', 'p', 0, %s)",
                        (tenant, task, later + timedelta(days=1)),
                    )
            # Control: an event without a version lands in the month two ahead.
            tenant, task = made[1]
            [(event_id,)] = conn.execute(
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version, created_at) VALUES (%s, %s, 'note', 't', 'p', %s) RETURNING id",
                (tenant, task, later + timedelta(days=1)),
            ).fetchall()
            [(where,)] = conn.execute(
                "SELECT tableoid::regclass::text FROM agent_events"
                " WHERE tenant_id = %s AND id = %s",
                (tenant, event_id),
            ).fetchall()
            assert str(where).startswith(f"agent_events_p{later:%Y_%m}")
