"""Citus against plain Postgres on the same box: the full task cycle, 1, 2 and 4 workers.

When ``--dsn`` names a Citus coordinator (its database has the citus
extension and active workers), the bench creates a database on the
coordinator and on every worker, distributes it (``migrate --citus``), and a
plain database on the coordinator's own server. Each worker count runs the
same cycle on both, interleaved: seed tasks over several tenants, then
``workers`` loops each claim one task and finish it (``tasks.transition``
under its lease) until none is left. On plain Postgres the one-statement
forms run; on Citus the per-tenant routed ones (``agentdb/_citus/routed.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from psycopg import sql

from agentdb import _db, leases, tasks, tenancy
from agentdb.tools.bench.harness import HOUR, Databases, _admin

__all__ = ["WORKERS", "bench_citus", "citus_workers", "node_urls"]

WORKERS = (1, 2, 4)
_TENANTS = 8


def citus_workers(admin_dsn: str) -> list[tuple[str, int]]:
    """The active Citus workers registered in ``admin_dsn``'s database; ``[]``: not Citus.

    Raises:
        DatabaseUnavailable: the server cannot be reached or refuses the login.
    """
    with _admin(admin_dsn) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is None:
            return []
        rows = conn.execute(
            "SELECT node_name, node_port FROM citus_get_active_worker_nodes() ORDER BY 1, 2"
        ).fetchall()
    return [(str(h), int(p)) for h, p in rows]


def _on(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    creds = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{creds}{host}:{port}"))


def node_urls(url: str, workers: list[tuple[str, int]]) -> list[str]:
    """``url``'s database on each of ``workers`` (host, port)."""
    return [_on(url, h, p) for h, p in workers]


@contextlib.contextmanager
def citus_database(dbs: Databases, workers: list[tuple[str, int]]) -> Iterator[str]:
    """A new database on the coordinator and every worker, distributed; dropped afterwards.

    Raises:
        psycopg.Error: a node refused (no CREATEDB right, citus not installed there).
        MigrationError: the migrations or the distribution failed.
    """
    from agentdb.migrate import migrate

    name = dbs.name("citus")
    coord = dbs.url(name)
    nodes = [coord, *(_on(coord, h, p) for h, p in workers)]
    made: list[str] = []
    try:
        for url in nodes:
            with _admin(urlunsplit(urlsplit(url)._replace(path="/postgres"))) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            made.append(url)
            with _admin(url) as conn:
                conn.execute("CREATE EXTENSION citus")
        parts = urlsplit(coord)
        with _admin(coord) as conn:
            conn.execute(
                "SELECT citus_set_coordinator_host(%s, %s)", (parts.hostname, parts.port or 5432)
            )
            for h, p in workers:
                conn.execute("SELECT citus_add_node(%s, %s)", (h, p))
        migrate(coord, citus=True)
        yield coord
    finally:
        for url in reversed(made):
            with _admin(urlunsplit(urlsplit(url)._replace(path="/postgres"))) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@dataclass
class _Remote:
    """What the coordinator sent the workers during a counted cycle (citus.log_remote_commands):
    each command is one NOTICE to the session that caused it."""

    claim: int = 0  # commands sent while leases.claim ran
    finish: int = 0  # ... while tasks.transition ran
    prepared: int = 0  # PREPARE TRANSACTION among them (two-phase commits)
    phase: str = "claim"

    def heard(self, _conn: object, message: Any) -> None:
        text = str(getattr(message, "message", message))
        if not text.startswith("issuing "):
            return
        if "PREPARE TRANSACTION" in text:
            self.prepared += 1
        if self.phase == "claim":
            self.claim += 1
        else:
            self.finish += 1


async def _cycle(
    url: str,
    n_tasks: int,
    workers: int,
    remote: _Remote | None = None,
    nodes: list[str] | None = None,
) -> float:
    """Seed ``n_tasks`` over the tenants, drain them with ``workers`` loops; tasks per second.

    With ``remote``, each loop's connection logs the commands Citus sends the workers
    (``citus.log_remote_commands``) and ``remote`` counts them by phase: a counted run,
    slower than a timed one (every command is a message to the client).
    """
    setup = await _db.connect(url)
    try:
        tenants = [
            await tenancy.create_tenant(setup, f"bench-citus-{uuid.uuid4().hex[:8]}")
            for _ in range(_TENANTS)
        ]
        for i in range(n_tasks):
            await tasks.create(setup, tenants[i % _TENANTS], "cycle")
    finally:
        await setup.close()
    # With ``nodes``, the loops connect to the worker nodes in turn instead of ``url``.
    conns = [await _db.connect(nodes[i % len(nodes)] if nodes else url) for i in range(workers)]
    done = 0

    async def loop(conn: _db.Conn, me: str) -> None:
        nonlocal done
        after: uuid.UUID | None = None
        counted = _Remote() if remote is not None else None
        if counted is not None:
            await conn.execute("SET citus.log_remote_commands = on")
            conn.add_log_listener(counted.heard)
        while True:
            if counted is not None:
                counted.phase = "claim"
            got = await leases.claim(conn, me, lease_ttl=HOUR, task_types=["cycle"],
                                     after_tenant=after)  # fmt: skip
            if not got:
                break
            t = got[0]
            after = t.tenant_id
            if counted is not None:
                counted.phase = "finish"
            await tasks.transition(
                conn, t.tenant_id, t.id, expected_version=t.state_version,
                to_state="succeeded", lease=t.lease,
            )  # fmt: skip
            done += 1
        if counted is not None and remote is not None:
            remote.claim += counted.claim
            remote.finish += counted.finish
            remote.prepared += counted.prepared

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(c, f"bench-{i}") for i, c in enumerate(conns)))
        seconds = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    if done != n_tasks:
        raise RuntimeError(f"the cycle finished {done} of {n_tasks} tasks")
    return done / seconds


async def bench_citus(
    citus_url: str, plain_url: str, n_tasks: int, reps: int, nodes: list[str] | None = None
) -> dict[str, Any]:
    """Tasks per second of the full cycle on Citus and on plain Postgres, per worker count;
    with ``nodes`` (the database on each worker node), also with the loops connected to
    the worker nodes in turn instead of the coordinator ("citus_nodes").

    Raises:
        RuntimeError: a run did not finish every task.
        mapped database errors.
    """
    out: dict[str, dict[str, list[float]]] = {"citus": {}, "plain": {}}
    kinds: list[tuple[str, str, list[str] | None]] = [
        ("plain", plain_url, None), ("citus", citus_url, None),
    ]  # fmt: skip
    if nodes:
        out["citus_nodes"] = {}
        kinds.append(("citus_nodes", citus_url, nodes))
    for _ in range(reps):
        for w in WORKERS:
            for kind, url, on in kinds:
                out[kind].setdefault(str(w), []).append(await _cycle(url, n_tasks, w, nodes=on))
    # The remote commands of the cycle under load (the most loops), counted in a
    # run of their own: counting slows the session down.
    remote = _Remote()
    await _cycle(citus_url, n_tasks, WORKERS[-1], remote)
    return {
        "workers": list(WORKERS),
        "tasks": n_tasks,
        "tasks_per_s": out,
        "remote_commands": {
            "loops": WORKERS[-1],
            "claim_per_task": remote.claim / n_tasks,
            "finish_per_task": remote.finish / n_tasks,
            "prepare_transaction": remote.prepared,
        },
    }
