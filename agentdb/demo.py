"""``agentdb demo``: a multi-tenant agent workload, with crashes, and what came of it.

Several worker *processes* run invoice tasks; each task charges a card and
sends an email through a fake provider (latency, refusals, timeouts whose
effect did happen) and finishes with an outbox message. Relay processes
deliver those messages to a fake consumer that deduplicates with the inbox.
Meanwhile worker and relay processes are killed with SIGKILL at random and
restarted. At the end the report counts, from the database alone: effects
the provider executed, duplicate effects (must be 0), operations reconciled
after crashes, messages delivered, redeliveries the inbox absorbed, messages
lost (must be 0).

The provider keeps its own ledger (schema ``agentdb_demo``) and records every
request it receives, so a duplicate would be visible there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from agentdb import inbox, tasks, tenancy
from agentdb.models import Message, Operation, OutboxMessage
from agentdb.worker import Job, Reconciled, Succeed

__all__ = ["PUBLISHER", "WORKER", "main"]

TASK_TYPE = "demo.invoice"
ACTIONS = ("charge", "email")
REFUSE_RATE = 0.06  # the provider answers 503 before doing anything
TIMEOUT_RATE = 0.04  # the provider does it, but the answer never arrives
BROKER_DOWN_RATE = 0.03  # the consumer is unreachable: nothing delivered
ACK_LOST_RATE = 0.03  # the consumer processed it, but the relay never hears back

_SCHEMA = (
    "CREATE SCHEMA IF NOT EXISTS agentdb_demo",
    "DROP TABLE IF EXISTS agentdb_demo.provider_requests, agentdb_demo.provider_effects,"
    " agentdb_demo.consumer_ledger, agentdb_demo.consumer_redeliveries",
    "CREATE TABLE agentdb_demo.provider_requests (id bigserial PRIMARY KEY, key text NOT NULL,"
    " action text NOT NULL, task_id uuid NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE agentdb_demo.provider_effects (key text PRIMARY KEY, action text NOT NULL,"
    " task_id uuid NOT NULL, ref text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE agentdb_demo.consumer_ledger (tenant_id uuid NOT NULL, message_id uuid NOT NULL,"
    " invoice int NOT NULL, PRIMARY KEY (tenant_id, message_id))",
    "CREATE TABLE agentdb_demo.consumer_redeliveries (id bigserial PRIMARY KEY,"
    " message_id uuid NOT NULL)",
)


class ProviderError(Exception):
    """The provider refused the request; nothing happened."""


class ProviderTimeout(Exception):
    """No answer in time; the effect may or may not have happened."""


_rng = random.Random()
_pool: asyncpg.Pool | None = None


async def _provider_pool() -> asyncpg.Pool:
    """The fake provider's and consumer's own connections (separate from agentdb's)."""
    global _pool
    if _pool is None:
        seed = os.environ.get("AGENTDB_DEMO_SEED")
        _rng.seed(f"{seed}:{os.getpid()}" if seed else None)
        _pool = await asyncpg.create_pool(os.environ["DATABASE_URL"], min_size=1, max_size=2)
    return _pool


async def provider_call(key: str, action: str, task_id: uuid.UUID) -> str:
    """Perform ``action`` once per idempotency ``key``; return the provider's reference."""
    pool = await _provider_pool()
    await asyncio.sleep(_rng.uniform(0.005, 0.04))
    if _rng.random() < REFUSE_RATE:
        await pool.execute(
            "INSERT INTO agentdb_demo.provider_requests (key, action, task_id, outcome)"
            " VALUES ($1, $2, $3, 'refused')",
            key,
            action,
            task_id,
        )
        raise ProviderError("503 service unavailable")
    ref = await pool.fetchval(
        "WITH req AS (INSERT INTO agentdb_demo.provider_requests (key, action, task_id, outcome)"
        "             VALUES ($1, $2, $3, 'accepted')),"
        " eff AS (INSERT INTO agentdb_demo.provider_effects (key, action, task_id, ref)"
        "         VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING ref)"
        " SELECT ref FROM eff UNION ALL"
        " SELECT ref FROM agentdb_demo.provider_effects WHERE key = $1",
        key,
        action,
        task_id,
        f"{action}_{uuid.uuid4().hex[:10]}",
    )
    if _rng.random() < TIMEOUT_RATE:
        raise ProviderTimeout("no answer within 30s")
    return str(ref)


async def provider_lookup(op: Operation) -> Reconciled | None:
    """Reconcile hook: ask the provider whether the effect for this key happened."""
    pool = await _provider_pool()
    ref = await pool.fetchval(
        "SELECT ref FROM agentdb_demo.provider_effects WHERE key = $1", op.idempotency_key
    )
    return None if ref is None else Reconciled(True, str(ref), {"ref": str(ref)})


async def invoice(job: Job) -> Succeed:
    """Charge, then email; each effect reserved before the call and recorded after it."""
    params = job.task.params
    for action in ACTIONS:
        key = f"{job.task.id}/{action}"
        res = await job.reserve(
            key, action, {"invoice": params["invoice"], "amount": params["amount"]}
        )
        if not res.fresh:
            continue  # done by an earlier attempt (or reconciled just now)
        try:
            ref = await provider_call(key, action, job.task.id)
        except ProviderTimeout:
            await job.mark_unknown(res.operation, "provider timed out")
            raise
        except ProviderError as exc:
            await job.fail(res.operation, str(exc))
            raise
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
    return Succeed(outbox=(Message("invoice.paid", {"invoice": params["invoice"]}),))


@dataclass(frozen=True)
class _Handlers:
    handlers: dict[str, Any] = field(default_factory=lambda: {TASK_TYPE: invoice})
    reconcilers: dict[str, Any] = field(
        default_factory=lambda: dict.fromkeys(ACTIONS, provider_lookup)
    )


#: ``agentdb worker agentdb.demo:WORKER``
WORKER = _Handlers()


async def publish(message: OutboxMessage) -> None:
    """The fake consumer: applies each message once, whatever the relay repeats."""
    pool = await _provider_pool()
    if _rng.random() < BROKER_DOWN_RATE:
        raise ConnectionError("consumer unreachable")

    async def apply(conn: Any) -> None:
        await conn.execute(
            "INSERT INTO agentdb_demo.consumer_ledger (tenant_id, message_id, invoice)"
            " VALUES ($1, $2, $3)",
            message.tenant_id,
            message.id,
            message.payload["invoice"],
        )

    first, _ = await inbox.process_once(pool, message.tenant_id, "ledger", message.id, apply)
    if not first:
        await pool.execute(
            "INSERT INTO agentdb_demo.consumer_redeliveries (message_id) VALUES ($1)", message.id
        )
    if _rng.random() < ACK_LOST_RATE:
        raise TimeoutError("acknowledgement lost")


#: ``agentdb relay agentdb.demo:PUBLISHER``
PUBLISHER = publish


# ---- the orchestrator ----------------------------------------------------------------


@dataclass
class _Fleet:
    dsn: str
    env: dict[str, str]
    log: Any
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kills: int = 0

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "agentdb", *args, "--dsn", self.dsn, "--log-level", "warning"],
            env=self.env,
            stdout=self.log,
            stderr=self.log,
        )

    def worker(self) -> subprocess.Popen[bytes]:
        return self._spawn(
            "worker",
            "agentdb.demo:WORKER",
            "--concurrency",
            "4",
            "--poll-interval",
            "0.2",
            "--retry-base",
            "0.05",
            "--shutdown-grace",
            "1",
        )

    def relay(self) -> subprocess.Popen[bytes]:
        return self._spawn(
            "relay",
            "agentdb.demo:PUBLISHER",
            "--batch",
            "50",
            "--visibility",
            "2",
            "--poll-interval",
            "0.2",
            "--retry-base",
            "0.05",
        )

    def kill_one(self, rng: random.Random) -> None:
        group = self.workers if (rng.random() < 0.8 or not self.relays) else self.relays
        i = rng.randrange(len(group))
        victim = group[i]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.kills += 1
        group[i] = self.worker() if group is self.workers else self.relay()

    def stop(self) -> None:
        procs = self.workers + self.relays
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


_PROGRESS = (
    "SELECT count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'dead', 'cancelled')),"
    " (SELECT count(*) FROM agent_outbox o WHERE o.tenant_id = ANY ($1) AND o.state = 'pending')"
    " FROM agent_tasks WHERE tenant_id = ANY ($1) AND task_type = 'demo.invoice'"
)

_REPORT = {
    "tasks": "SELECT state, count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND task_type = 'demo.invoice' GROUP BY state",
    "requests": "SELECT count(*) FROM agentdb_demo.provider_requests",
    "refused": "SELECT count(*) FROM agentdb_demo.provider_requests WHERE outcome = 'refused'",
    "effects": "SELECT count(*) FROM agentdb_demo.provider_effects",
    "duplicates": "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n"
    " FROM agentdb_demo.provider_effects GROUP BY task_id, action) g",
    "reconciled": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.reconciled'",
    "unknown": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.unknown'",
    "reclaimed": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'task.reclaimed'",
    "outbox": "SELECT state, count(*) FROM agent_outbox WHERE tenant_id = ANY ($1) GROUP BY state",
    "consumed": "SELECT count(*) FROM agentdb_demo.consumer_ledger WHERE tenant_id = ANY ($1)",
    "redeliveries": "SELECT count(*) FROM agentdb_demo.consumer_redeliveries",
    "lost": "SELECT count(*) FROM agent_outbox o WHERE o.tenant_id = ANY ($1) AND NOT EXISTS"
    " (SELECT 1 FROM agentdb_demo.consumer_ledger c"
    "  WHERE c.tenant_id = o.tenant_id AND c.message_id = o.id)",
}


def _bar(done: int, total: int, kills: int, elapsed: float, tty: bool) -> str:
    width = 30
    filled = int(width * done / total) if total else width
    lead = "\r" if tty else ""
    return (
        f"{lead}[{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks"
        f"  {kills} kills  {elapsed:5.1f}s"
    )


async def _seed(
    pool: asyncpg.Pool, args: argparse.Namespace, rng: random.Random
) -> list[uuid.UUID]:
    async with pool.acquire() as conn:
        for statement in _SCHEMA:
            await conn.execute(statement)
    tenants = [await tenancy.create_tenant(pool, f"demo-tenant-{i}") for i in range(args.tenants)]
    for i in range(args.tasks):
        await tasks.create(
            pool,
            tenants[i % len(tenants)],
            TASK_TYPE,
            params={"invoice": i, "amount": rng.randint(1, 500)},
            dedupe_key=f"invoice-{i}",
            max_attempts=25,
            lease_ttl=_LEASE_TTL,
        )
    return tenants


_LEASE_TTL = timedelta(seconds=2)


async def _orchestrate(dsn: str, args: argparse.Namespace, log: Any, log_path: Path) -> int:
    rng = random.Random(args.seed)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
    tty = sys.stderr.isatty()
    try:
        tenant_ids = await _seed(pool, args, rng)
        env = dict(os.environ, DATABASE_URL=dsn)
        if args.seed is not None:
            env["AGENTDB_DEMO_SEED"] = str(args.seed)
        fleet = _Fleet(dsn, env, log)
        fleet.workers = [fleet.worker() for _ in range(args.workers)]
        fleet.relays = [fleet.relay() for _ in range(args.relays)]
        start = time.monotonic()
        next_kill = start + (rng.expovariate(1 / args.kill_every) if args.kill_every > 0 else 1e18)
        last_line = 0.0
        finished = False
        try:
            while time.monotonic() - start < args.timeout:
                row = await pool.fetchrow(_PROGRESS, tenant_ids)
                assert row is not None
                done, pending_out = int(row[0]), int(row[1])
                now = time.monotonic()
                if tty or now - last_line >= 5:
                    print(
                        _bar(done, args.tasks, fleet.kills, now - start, tty),
                        end="" if tty else "\n",
                        file=sys.stderr,
                        flush=True,
                    )
                    last_line = now
                if done == args.tasks and pending_out == 0:
                    finished = True
                    break
                if now >= next_kill and done < args.tasks:
                    fleet.kill_one(rng)
                    next_kill = now + rng.expovariate(1 / args.kill_every)
                await asyncio.sleep(0.2)
        finally:
            elapsed = time.monotonic() - start
            fleet.stop()
        print(
            _bar(args.tasks if finished else done, args.tasks, fleet.kills, elapsed, tty),
            file=sys.stderr,
        )
        return await _report(pool, tenant_ids, args, fleet.kills, elapsed, finished, log_path)
    finally:
        await pool.close()


async def _report(
    pool: asyncpg.Pool,
    tenants: list[uuid.UUID],
    args: argparse.Namespace,
    kills: int,
    elapsed: float,
    finished: bool,
    log_path: Path,
) -> int:
    async def one(name: str) -> int:
        sql = _REPORT[name]
        value = await (pool.fetchval(sql, tenants) if "$1" in sql else pool.fetchval(sql))
        return int(value or 0)

    by_state = {r[0]: r[1] for r in await pool.fetch(_REPORT["tasks"], tenants)}
    outbox_states = {r[0]: r[1] for r in await pool.fetch(_REPORT["outbox"], tenants)}
    succeeded = by_state.get("succeeded", 0)
    stuck = args.tasks - sum(
        by_state.get(s, 0) for s in ("succeeded", "failed", "dead", "cancelled")
    )
    duplicates, lost = await one("duplicates"), await one("lost")
    lines = [
        ("tasks completed", f"{succeeded} of {args.tasks}"
         + (f" ({by_state.get('dead', 0)} dead, {by_state.get('failed', 0)} failed)"
            if succeeded < args.tasks else "")),
        ("worker/relay processes killed (SIGKILL)", str(kills)),
        ("tasks taken over after a killed worker's lease expired", str(await one("reclaimed"))),
        ("provider requests received",
         f"{await one('requests')} ({await one('refused')} refused with 503)"),
        ("effects the provider executed", str(await one("effects"))),
        ("duplicate effects", str(duplicates)),
        ("operations with an unknown outcome (timeouts, crashes)", str(await one("unknown"))),
        ("operations reconciled from the provider's ledger", str(await one("reconciled"))),
        ("outbox messages delivered", str(outbox_states.get("delivered", 0))),
        ("consumer effects applied", str(await one("consumed"))),
        ("redeliveries absorbed by the inbox", str(await one("redeliveries"))),
        ("messages lost", str(lost)),
        ("tasks stuck", str(stuck)),
        ("throughput", f"{succeeded / elapsed:.1f} tasks/s over {elapsed:.1f}s"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in lines)
    print("\nagentdb demo report")
    for key, value in lines:
        print(f"  {key:<{width}}  {value}")
    ok = (
        finished
        and duplicates == 0
        and lost == 0
        and stuck == 0
        and (kills > 0 or args.kill_every == 0)
    )
    print(
        f"\n{'OK' if ok else 'FAILED'}: "
        + (
            "every effect once, every message delivered, nothing lost"
            if ok
            else f"see the worker and relay logs in {log_path}"
        )
    )
    return 0 if ok else 1


def main(args: argparse.Namespace) -> int:
    """Run the demo (``agentdb demo``); return the exit status."""
    from agentdb.errors import ConfigurationError

    if args.tasks < 1 or args.tenants < 1 or args.workers < 1 or args.relays < 1:
        raise ConfigurationError("--tasks, --tenants, --workers and --relays must be at least 1")
    log_path = Path(tempfile.mkdtemp(prefix="agentdb-demo-")) / "processes.log"
    if args.dsn:
        from agentdb.migrate import migrate

        migrate(args.dsn)
        with open(log_path, "ab") as log:
            return asyncio.run(_orchestrate(args.dsn, args, log, log_path))
    from agentdb.embedded import embedded_postgres

    print("starting an embedded Postgres (no server to install)...", file=sys.stderr)
    with embedded_postgres() as dsn, open(log_path, "ab") as log:
        return asyncio.run(_orchestrate(dsn, args, log, log_path))
