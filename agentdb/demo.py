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

from agentdb import _faults, inbox, tasks, tenancy
from agentdb.models import Message, Operation, OutboxMessage
from agentdb.worker import Job, Reconciled, Succeed

__all__ = ["PUBLISHER", "WORKER", "main"]

TASK_TYPE = "demo.invoice"
ACTIONS = ("charge", "email")
# AGENTDB_DEMO_CALM=1 turns these off (the crash tests want exact counts).
_CALM = os.environ.get("AGENTDB_DEMO_CALM") == "1"
REFUSE_RATE = 0.0 if _CALM else 0.06  # the provider answers 503 before doing anything
TIMEOUT_RATE = 0.0 if _CALM else 0.04  # the provider does it, but the answer never arrives
BROKER_DOWN_RATE = 0.0 if _CALM else 0.03  # the consumer is unreachable: nothing delivered
ACK_LOST_RATE = 0.0 if _CALM else 0.03  # the consumer processed it; the relay never hears back

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
    """Perform ``action`` once per idempotency ``key``; return the provider's reference.

    Every request is logged on arrival, so the report can compare requests
    received with effects executed.
    """
    pool = await _provider_pool()
    await asyncio.sleep(_rng.uniform(0.005, 0.04))
    request = await pool.fetchval(
        "INSERT INTO agentdb_demo.provider_requests (key, action, task_id, outcome)"
        " VALUES ($1, $2, $3, 'received') RETURNING id",
        key,
        action,
        task_id,
    )
    _faults.point("during_call")  # the provider has the request; no effect yet
    if _rng.random() < REFUSE_RATE:
        await pool.execute(
            "UPDATE agentdb_demo.provider_requests SET outcome = 'refused' WHERE id = $1", request
        )
        raise ProviderError("503 service unavailable")
    # Honour the idempotency key: a repeated key returns the first effect's reference.
    ref = await pool.fetchval(
        "WITH eff AS (INSERT INTO agentdb_demo.provider_effects (key, action, task_id, ref)"
        "             VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING ref),"
        " req AS (UPDATE agentdb_demo.provider_requests"
        "         SET outcome = CASE WHEN EXISTS (SELECT 1 FROM eff) THEN 'executed'"
        "                            ELSE 'replayed' END WHERE id = $5)"
        " SELECT ref FROM eff UNION ALL"
        " SELECT ref FROM agentdb_demo.provider_effects WHERE key = $1",
        key,
        action,
        task_id,
        f"{action}_{uuid.uuid4().hex[:10]}",
        request,
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


@dataclass(frozen=True)
class Workload:
    """One run: how much work, how many processes, and how they are made to crash."""

    tasks: int = 300
    tenants: int = 5
    workers: int = 4
    relays: int = 2
    kill_every: float = 0.5  # mean seconds between external SIGKILLs; 0 for none
    worker_faults: str = ""  # AGENTDB_FAULTS for worker processes
    relay_faults: str = ""  # AGENTDB_FAULTS for relay processes
    timeout: float = 100.0
    seed: int | None = None
    max_attempts: int = 25
    lease_ttl: timedelta = timedelta(seconds=2)
    progress: bool = True


@dataclass
class Result:
    """What a run did, counted from the database."""

    finished: bool
    elapsed: float
    kills: int
    kills_by_point: dict[str, int]
    counts: dict[str, int]
    tasks_by_state: dict[str, int]
    outbox_by_state: dict[str, int]
    log_path: Path

    @property
    def stuck(self) -> int:
        terminal = ("succeeded", "failed", "dead", "cancelled")
        return sum(n for s, n in self.tasks_by_state.items() if s not in terminal)

    @property
    def ok(self) -> bool:
        return (
            self.finished
            and self.counts["duplicates"] == 0
            and self.counts["lost"] == 0
            and self.stuck == 0
        )


@dataclass
class _Fleet:
    dsn: str
    workload: Workload
    log: Any
    fault_log: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    external_kills: int = 0
    died: int = 0

    def _spawn(self, faults: str, *args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, DATABASE_URL=self.dsn, AGENTDB_FAULTS=faults)
        env["AGENTDB_FAULTS_LOG"] = str(self.fault_log)
        if self.workload.seed is not None:
            env["AGENTDB_DEMO_SEED"] = str(self.workload.seed)
        return subprocess.Popen(
            [sys.executable, "-m", "agentdb", *args, "--dsn", self.dsn, "--log-level", "warning"],
            env=env,
            stdout=self.log,
            stderr=self.log,
        )

    def worker(self) -> subprocess.Popen[bytes]:
        return self._spawn(
            self.workload.worker_faults,
            "worker", "agentdb.demo:WORKER", "--concurrency", "4", "--poll-interval", "0.2",
            "--retry-base", "0.05", "--shutdown-grace", "1",
        )  # fmt: skip

    def relay(self) -> subprocess.Popen[bytes]:
        return self._spawn(
            self.workload.relay_faults,
            "relay", "agentdb.demo:PUBLISHER", "--batch", "50", "--visibility", "2",
            "--poll-interval", "0.2", "--retry-base", "0.05",
        )  # fmt: skip

    def kill_one(self, rng: random.Random) -> None:
        group = self.workers if (rng.random() < 0.8 or not self.relays) else self.relays
        victim = group[rng.randrange(len(group))]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.external_kills += 1

    def supervise(self) -> None:
        """Replace every process that died (killed from outside or by a fault point)."""
        for group, make in ((self.workers, self.worker), (self.relays, self.relay)):
            for i, proc in enumerate(group):
                code = proc.poll()
                if code is not None:
                    self.died += 1
                    group[i] = make()

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

_COUNTS = {
    "requests": "SELECT count(*) FROM agentdb_demo.provider_requests",
    "refused": "SELECT count(*) FROM agentdb_demo.provider_requests WHERE outcome = 'refused'",
    "effects": "SELECT count(*) FROM agentdb_demo.provider_effects",
    "replayed": "SELECT count(*) FROM agentdb_demo.provider_requests WHERE outcome = 'replayed'",
    "duplicates": "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n"
    " FROM agentdb_demo.provider_effects GROUP BY task_id, action) g",
    "reconciled": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.reconciled'",
    "unknown": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.unknown'",
    "reclaimed": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'task.reclaimed'",
    "consumed": "SELECT count(*) FROM agentdb_demo.consumer_ledger WHERE tenant_id = ANY ($1)",
    "redeliveries": "SELECT count(*) FROM agentdb_demo.consumer_redeliveries",
    "lost": "SELECT count(*) FROM agent_outbox o WHERE o.tenant_id = ANY ($1) AND NOT EXISTS"
    " (SELECT 1 FROM agentdb_demo.consumer_ledger c"
    "  WHERE c.tenant_id = o.tenant_id AND c.message_id = o.id)",
}
_TASKS_BY_STATE = (
    "SELECT state, count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND task_type = 'demo.invoice' GROUP BY state"
)
_OUTBOX_BY_STATE = (
    "SELECT state, count(*) FROM agent_outbox WHERE tenant_id = ANY ($1) GROUP BY state"
)


def _bar(done: int, total: int, kills: int, elapsed: float, tty: bool) -> str:
    width = 30
    filled = int(width * done / total) if total else width
    lead = "\r" if tty else ""
    return (
        f"{lead}[{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks"
        f"  {kills} kills  {elapsed:5.1f}s"
    )


async def _seed(pool: asyncpg.Pool, w: Workload, rng: random.Random) -> list[uuid.UUID]:
    async with pool.acquire() as conn:
        for statement in _SCHEMA:
            await conn.execute(statement)
    run = uuid.uuid4().hex[:6]
    tenants = [await tenancy.create_tenant(pool, f"demo-{run}-{i}") for i in range(w.tenants)]
    for i in range(w.tasks):
        await tasks.create(
            pool, tenants[i % len(tenants)], TASK_TYPE,
            params={"invoice": i, "amount": rng.randint(1, 500)},
            dedupe_key=f"invoice-{run}-{i}", max_attempts=w.max_attempts, lease_ttl=w.lease_ttl,
        )  # fmt: skip
    return tenants


def _kills_by_point(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    if path.exists():
        for line in path.read_text().split():
            found[line] = found.get(line, 0) + 1
    return found


async def run_workload(dsn: str, w: Workload, log: Any, log_path: Path) -> Result:
    """Seed ``w.tasks`` invoice tasks, run the fleet with its crashes until done, and count."""
    rng = random.Random(w.seed)
    tty = w.progress and sys.stderr.isatty()
    fault_log = log_path.with_suffix(".faults")
    fault_log.unlink(missing_ok=True)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
    try:
        tenant_ids = await _seed(pool, w, rng)
        fleet = _Fleet(dsn, w, log, fault_log)
        fleet.workers = [fleet.worker() for _ in range(w.workers)]
        fleet.relays = [fleet.relay() for _ in range(w.relays)]
        start = time.monotonic()
        next_kill = start + (rng.expovariate(1 / w.kill_every) if w.kill_every > 0 else 1e18)
        last_line, finished, done = 0.0, False, 0
        try:
            while time.monotonic() - start < w.timeout:
                row = await pool.fetchrow(_PROGRESS, tenant_ids)
                assert row is not None
                done, pending_out = int(row[0]), int(row[1])
                now = time.monotonic()
                if w.progress and (tty or now - last_line >= 5):
                    bar = _bar(done, w.tasks, fleet.died, now - start, tty)
                    print(bar, end="" if tty else "\n", file=sys.stderr, flush=True)
                    last_line = now
                if done == w.tasks and pending_out == 0:
                    finished = True
                    break
                if now >= next_kill and done < w.tasks:
                    fleet.kill_one(rng)
                    next_kill = now + rng.expovariate(1 / w.kill_every)
                fleet.supervise()
                await asyncio.sleep(0.1)
        finally:
            elapsed = time.monotonic() - start
            fleet.supervise()
            fleet.stop()
        if w.progress:
            print(_bar(done, w.tasks, fleet.died, elapsed, tty), file=sys.stderr)
        counts = {}
        for name, sql in _COUNTS.items():
            value = await (pool.fetchval(sql, tenant_ids) if "$1" in sql else pool.fetchval(sql))
            counts[name] = int(value or 0)
        by_point = _kills_by_point(fault_log)
        return Result(
            finished=finished,
            elapsed=elapsed,
            kills=fleet.external_kills + sum(by_point.values()),
            kills_by_point=by_point,
            counts=counts,
            tasks_by_state={r[0]: r[1] for r in await pool.fetch(_TASKS_BY_STATE, tenant_ids)},
            outbox_by_state={r[0]: r[1] for r in await pool.fetch(_OUTBOX_BY_STATE, tenant_ids)},
            log_path=log_path,
        )
    finally:
        await pool.close()


def _report(w: Workload, r: Result) -> int:
    c = r.counts
    succeeded = r.tasks_by_state.get("succeeded", 0)
    lines = [
        ("tasks completed", f"{succeeded} of {w.tasks}"
         + (f" ({r.tasks_by_state.get('dead', 0)} dead, {r.tasks_by_state.get('failed', 0)} failed)"
            if succeeded < w.tasks else "")),
        ("worker/relay processes killed (SIGKILL)", str(r.kills)),
        ("tasks taken over after a killed worker's lease expired", str(c["reclaimed"])),
        ("provider requests received", f"{c['requests']} ({c['refused']} refused with 503)"),
        ("effects the provider executed", str(c["effects"])),
        ("repeat requests the provider answered from its key", str(c["replayed"])),
        ("duplicate effects", str(c["duplicates"])),
        ("operations with an unknown outcome (timeouts, crashes)", str(c["unknown"])),
        ("operations reconciled from the provider's ledger", str(c["reconciled"])),
        ("outbox messages delivered", str(r.outbox_by_state.get("delivered", 0))),
        ("consumer effects applied", str(c["consumed"])),
        ("redeliveries absorbed by the inbox", str(c["redeliveries"])),
        ("messages lost", str(c["lost"])),
        ("tasks stuck", str(r.stuck)),
        ("throughput", f"{succeeded / r.elapsed:.1f} tasks/s over {r.elapsed:.1f}s"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in lines)
    print("\nagentdb demo report")
    for key, value in lines:
        print(f"  {key:<{width}}  {value}")
    ok = r.ok and (r.kills > 0 or w.kill_every == 0)
    verdict = (
        "every effect once, every message delivered, nothing lost"
        if ok
        else f"see the worker and relay logs in {r.log_path}"
    )
    print(f"\n{'OK' if ok else 'FAILED'}: {verdict}")
    return 0 if ok else 1


def with_database(dsn: str | None, body: Any) -> Any:
    """Run ``body(dsn, log, log_path)`` against ``dsn`` (migrated) or an embedded Postgres."""
    log_path = Path(tempfile.mkdtemp(prefix="agentdb-run-")) / "processes.log"
    if dsn:
        from agentdb.migrate import migrate

        migrate(dsn)
        with open(log_path, "ab") as log:
            return body(dsn, log, log_path)
    from agentdb.embedded import embedded_postgres

    print("starting an embedded Postgres (no server to install)...", file=sys.stderr)
    with embedded_postgres() as local, open(log_path, "ab") as log:
        return body(local, log, log_path)


def main(args: argparse.Namespace) -> int:
    """Run the demo (``agentdb demo``); return the exit status."""
    from agentdb.errors import ConfigurationError

    if args.tasks < 1 or args.tenants < 1 or args.workers < 1 or args.relays < 1:
        raise ConfigurationError("--tasks, --tenants, --workers and --relays must be at least 1")
    w = Workload(
        tasks=args.tasks, tenants=args.tenants, workers=args.workers, relays=args.relays,
        kill_every=args.kill_every, timeout=args.timeout, seed=args.seed,
    )  # fmt: skip

    def body(dsn: str, log: Any, log_path: Path) -> int:
        return _report(w, asyncio.run(run_workload(dsn, w, log, log_path)))

    result: int = with_database(args.dsn, body)
    return result
