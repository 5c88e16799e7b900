"""The run: create the databases, interleave the contenders of each comparison, write the report.

Inside every repetition each contender runs once, back to back (A B A B
...), on the same server and in the same process, so noisy neighbours hit
every contender alike; each timed run starts from freshly analysed tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import importlib.util
import math
import os
import platform
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, LiteralString
from urllib.parse import unquote, urlsplit

from agentdb import _db, _dsn, tenancy
from agentdb.errors import ConfigurationError
from agentdb.tools._signals import run_async, sigterm_raises
from agentdb.tools.bench.budget import bench_budget
from agentdb.tools.bench.citus import bench_citus, citus_database, citus_workers, node_urls
from agentdb.tools.bench.cycle import AGENTDB_RUNS
from agentdb.tools.bench.harness import (
    ANALYZE,
    FULL,
    QUICK,
    SKIP_1M_LARGE,
    Clock,
    Cycle,
    Database,
    Databases,
    Probe,
    Sizes,
    Window,
    hold,
    migrate_locked,
    seed_tasks,
)
from agentdb.tools.bench.peers import (
    Peers,
    pgqueuer_install,
    pgqueuer_run,
    procrastinate_install,
    procrastinate_run,
)
from agentdb.tools.bench.pickup import bench_pickup
from agentdb.tools.bench.relay import bench_relay
from agentdb.tools.bench.report import write_outputs
from agentdb.tools.bench.scaling import bench_scaling, bench_tenant_scaling
from agentdb.tools.bench.snapshot import bench_snapshot, offered_rate
from agentdb.tools.bench.statements import STATEMENTS, Body, Slot, open_slots
from agentdb.tools.bench.targets import BY_HAND, DURABLE, WORKER_10, WORKER_100
from agentdb.tools.bench.versus import bench_versus, dbos_install
from agentdb.tools.bench.workers import worker_run
from agentdb.tools.pgbouncer import find_binary, pgbouncer

__all__ = ["Options", "bench_cycle", "bench_statements", "run"]

# Untimed statements per connection and variant before the timed ones.
_WARM = 4
_COUNT_DONE: LiteralString = (
    "SELECT count(*) FROM agent_tasks WHERE task_type = $1 AND state = 'succeeded'"
)


@dataclass
class Options:
    """The command line's choices (see :func:`agentdb.tools.bench.command.add_arguments`)."""

    dsn: str | None
    quick: bool
    reps: int
    out: Path
    skip_1m: bool
    snapshot_seconds: float | None = None
    #: "all"; "dbos": only agentdb against DBOS; "wal": that, once, for its WAL breakdown
    only: str = "all"
    #: agentdb against DBOS: single-effect units run on each side before the measured runs
    history: int = 0


# --- 1. Statement overhead --------------------------------------------------


async def _each(held: list[_db.Conn], slots: list[Slot], body: Body, n: int, tag: str) -> None:
    """``body`` ``n`` times on every connection at once, each for its own slot."""
    await asyncio.gather(
        *(body(c, s, n, f"{tag}-{k}") for k, (c, s) in enumerate(zip(held, slots, strict=True)))
    )


async def _statement(
    held: list[_db.Conn],
    slots: list[Slot],
    pair: tuple[str, Body, Body],
    per_conn: int,
    reps: int,
    probe: Probe,
    dbname: str,
) -> dict[str, Any]:
    """One statement's helper and raw variants, interleaved over ``reps`` repetitions.

    Raises:
        RuntimeError: a variant's statement matched nothing.
    """
    name, helper, raw = pair
    total = per_conn * len(held)
    variants = (("agentdb", "helper", helper), ("raw", "raw", raw))
    if name == "complete":
        # The raw reserve runs reserved operations too: complete those as well,
        # so both variants have enough to settle.
        for s in slots:
            s.adopt_raw()
    # Untimed warm-up: prepares the statements on every connection and gives
    # empty tables rows, so the plans Postgres caches (its own foreign-key
    # checks included) are made with real statistics.
    for variant, _, body in variants:
        await _each(held, slots, body, _WARM, f"warm-{variant}")
    rates: dict[str, list[float]] = {"agentdb": [], "raw": []}
    cpu: dict[str, list[float]] = {
        f"{v}_{k}": [] for v in ("helper", "raw") for k in ("client_us", "server_us")
    }
    for rep in range(reps):
        # Alternate which goes first, as the budget section does: a rep's second
        # run meets bigger tables and a warmer cache than its first.
        for variant, who, body in variants if rep % 2 == 0 else variants[::-1]:
            await held[0].execute(ANALYZE)
            work = functools.partial(_each, held, slots, body, per_conn, f"{variant}-{rep}")
            _, window = await probe.timed(dbname, work)
            rates[variant].append(total / window.seconds)
            usage = probe.usage(window, total)
            cpu[f"{who}_client_us"].append(usage["client_cpu_us_per_unit"])
            if "server_cpu_us_per_unit" in usage:
                cpu[f"{who}_server_us"].append(usage["server_cpu_us_per_unit"])
    return {"statement": name, "ops_per_rep": total, "connections": len(held), **rates, **cpu}


async def bench_statements(
    db: Database,
    sizes: Sizes,
    reps: int,
    probe: Probe,
    *,
    url: str | None = None,
    pooler: str = "none",
) -> list[dict[str, Any]]:
    """Each helper against its raw SQL, on ``sizes.stmt_conns`` connections at once.

    ``url`` and ``pooler`` send both variants elsewhere (through a PgBouncer in
    transaction mode: unnamed statements for the helper and the raw SQL alike).

    Raises:
        DatabaseUnavailable: the pool could not be opened.
        RuntimeError: a raw statement matched nothing (its statement changed shape).
    """
    conns = sizes.stmt_conns
    per_conn = max(1, sizes.stmt_ops // conns)
    total = per_conn * conns
    pool = await _db.create_pool(url or db.url, min_size=conns, max_size=conns, pooler=pooler)
    try:
        tenant = await tenancy.create_tenant(pool, f"bench-statements-{uuid.uuid4().hex[:8]}")
        await seed_tasks(pool, tenant, "slot", conns)
        await seed_tasks(pool, tenant, "claim", (total + _WARM * conns) * 2 * reps)
        slots = await open_slots(pool, tenant, conns)
        async with hold(pool, conns) as held:
            return [
                await _statement(held, slots, pair, per_conn, reps, probe, db.name)
                for pair in STATEMENTS
            ]
    finally:
        await pool.close()


# --- 2. Task cycle -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Contender:
    name: str
    workers: int
    kind: str  # agentdb-single, -batched, -noop, -worker, pgqueuer or procrastinate
    batch: int
    note: str = ""


# The slow paths run fewer tasks, so that every contender's run takes seconds.
_SLOW = ("procrastinate", "agentdb-single")


def _contenders(peers: set[str]) -> list[_Contender]:
    out: list[_Contender] = []
    for w in (1, 4):
        out += [
            _Contender("agentdb, one statement per step", w, "agentdb-single", 10,
                       "claim 10, then reserve, complete and finish each task"),
            _Contender("agentdb batched, batch 10", w, "agentdb-batched", 10,
                       "claim, reserve_many, complete_many, tasks.finish_many"),
            _Contender("agentdb batched, batch 250", w, "agentdb-batched", 250,
                       "the same, 250 tasks per statement"),
            _Contender("agentdb no-op tasks, batch 250", w, "agentdb-noop", 250,
                       "claim, tasks.finish_many: no operation, no outbox row"),
            _Contender(WORKER_10, w, "agentdb-worker", 10,
                       f"{w} `agentdb worker` process(es), full cycle, group commit"),
            _Contender(WORKER_100, w, "agentdb-worker", 100,
                       f"{w} `agentdb worker` process(es), full cycle, group commit"),
            _Contender("PgQueuer default (batch 10)", w, "pgqueuer", 10, "no-op jobs"),
            _Contender("PgQueuer tuned (batch 250)", w, "pgqueuer", 250, "no-op jobs"),
            _Contender("Procrastinate", w, "procrastinate", 1,
                       f"no-op jobs, {w} worker(s) of concurrency 1"),
        ]  # fmt: skip
    out += [
        _Contender(DURABLE, 4, "agentdb-durable", 10,
                   "4 `agentdb worker` processes: job.step/effect/sleep, each re-entry one read"),
        _Contender(BY_HAND, 4, "agentdb-by-hand", 10,
                   "the same 6 steps and 5 waits: current_step, effects replayed by reserve"),
    ]  # fmt: skip
    return [c for c in out if c.kind.startswith("agentdb") or c.kind in peers]


#: The contenders that are real worker processes, and the handler each runs.
_WORKER_KINDS = {
    "agentdb-worker": "cycle",
    "agentdb-durable": "durable",
    "agentdb-by-hand": "by-hand",
}


def _cycle_row(c: _Contender) -> dict[str, Any]:
    return {
        "name": c.name,
        "workers": c.workers,
        "kind": c.kind,
        "batch": c.batch,
        "note": c.note,
        "tasks_per_s": [],
        "client_cpu_share": [],
        "server_cpu_share": [],
        "client_cpu_us_per_task": [],
        "server_cpu_us_per_task": [],
        "wal_bytes_per_task": [],
        "tasks_per_run": 0,
        "errors": [],
    }


@dataclass
class _CycleBench:
    """What every task-cycle run needs: agentdb's pool and tenant, the peers' databases."""

    db: Database
    peer_dbs: dict[str, Database]
    pool: _db.Pool
    tenant: uuid.UUID
    probe: Probe
    runs: int = 0

    async def _agentdb(
        self, c: _Contender, n: int, clock: Clock, errors: list[str], rep: int
    ) -> tuple[Cycle, Window]:
        # A task type per run keeps each run's claims to the tasks seeded for it.
        self.runs += 1
        task_type = f"cycle-{self.runs}"
        await seed_tasks(self.pool, self.tenant, task_type, n)
        await self.pool.execute(ANALYZE)
        async with hold(self.pool, c.workers) as held:
            work = functools.partial(AGENTDB_RUNS[c.kind], held, task_type, clock, c.batch)
            got, window = await self.probe.timed(self.db.name, work)
        finished = await self.pool.fetchval(_COUNT_DONE, task_type)
        if finished != n or got.refused:
            errors.append(f"rep {rep}: {finished} of {n} succeeded, {got.refused} refused")
        return got, window

    async def one(
        self, c: _Contender, n: int, clock: Clock, errors: list[str], rep: int
    ) -> tuple[Cycle, Window]:
        """Run contender ``c`` over ``n`` tasks (or jobs); return what ran and its window.

        Raises:
            whatever the contender raises (the caller decides whether that is fatal).
        """
        if c.kind in _WORKER_KINDS:  # _record says if not all n succeeded
            self.runs += 1
            return await worker_run(self.db, self.pool, self.tenant, f"cycle-{self.runs}",
                                    c.workers, c.batch, n, clock, self.probe,
                                    _WORKER_KINDS[c.kind])  # fmt: skip
        if c.kind.startswith("agentdb"):
            return await self._agentdb(c, n, clock, errors, rep)
        if c.kind == "pgqueuer":
            return await pgqueuer_run(
                self.peer_dbs["pgqueuer"], c.workers, c.batch, n, clock, self.probe
            )
        return await procrastinate_run(
            self.peer_dbs["procrastinate"], c.workers, n, clock, self.probe
        )


def _record(
    row: dict[str, Any], rep: int, n: int, got: Cycle, window: Window, clock: Clock, probe: Probe
) -> None:
    """Add one run's throughput and costs to its contender's row (or say why not)."""
    if got.done != n:
        row["errors"].append(f"rep {rep}: {got.done} of {n} jobs ran")
    if clock.first is None or window.end <= clock.first:
        row["errors"].append(f"rep {rep}: no work was timed")
        return
    usage = probe.usage(window, n)
    if got.client_cpu is not None:  # the work ran in other processes: theirs is the client CPU
        usage["client_cpu_share"] = got.client_cpu / (window.end - clock.first)
        usage["client_cpu_us_per_unit"] = got.client_cpu * 1e6 / n if n else math.nan
    row["tasks_per_s"].append(got.done / (window.end - clock.first))
    row["client_cpu_share"].append(usage["client_cpu_share"])
    row["client_cpu_us_per_task"].append(usage["client_cpu_us_per_unit"])
    row["wal_bytes_per_task"].append(usage["wal_bytes_per_unit"])
    if "server_cpu_us_per_unit" in usage:
        row["server_cpu_us_per_task"].append(usage["server_cpu_us_per_unit"])
        row["server_cpu_share"].append(usage["server_cpu_share"])


async def bench_cycle(
    db: Database,
    peer_dbs: dict[str, Database],
    sizes: Sizes,
    reps: int,
    probe: Probe,
    notes: list[str],
) -> list[dict[str, Any]]:
    """The task cycle for every contender, with 1 and 4 workers.

    A peer that fails is left out (and said so in ``notes``); agentdb failing is fatal.

    Raises:
        DatabaseUnavailable: agentdb's pool could not be opened; whatever agentdb raises.
    """
    contenders = _contenders(set(peer_dbs))
    rows = {(c.name, c.workers): _cycle_row(c) for c in contenders}
    pool = await _db.create_pool(db.url, min_size=4, max_size=4)
    failed: set[str] = set()
    try:
        tenant = await tenancy.create_tenant(pool, f"bench-cycle-{uuid.uuid4().hex[:8]}")
        bench = _CycleBench(db, peer_dbs, pool, tenant, probe)
        for rep in range(reps):
            for c in contenders:
                if c.kind in failed:
                    continue
                row = rows[(c.name, c.workers)]
                n = sizes.cycle_tasks_slow if c.kind in _SLOW else sizes.cycle_tasks
                row["tasks_per_run"] = n
                clock = Clock()
                try:
                    got, window = await bench.one(c, n, clock, row["errors"], rep)
                except Exception as exc:
                    if c.kind.startswith("agentdb"):
                        raise
                    failed.add(c.kind)
                    notes.append(f"{c.kind} failed and was left out: {type(exc).__name__}: {exc}")
                    continue
                _record(row, rep, n, got, window, clock, probe)
    finally:
        await pool.close()
    return [r for r in rows.values() if r["tasks_per_s"] or r["errors"]]


# --- The run -----------------------------------------------------------------


def _versions(server: str, peers: Peers) -> dict[str, str]:
    from agentdb import __version__

    v = {
        "postgres": server,
        "agentdb": __version__,
        "python": platform.python_version(),
        "asyncpg": importlib.metadata.version("asyncpg"),
        "psycopg": importlib.metadata.version("psycopg"),
    }
    v.update(peers.versions)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        v["matplotlib"] = importlib.metadata.version("matplotlib")
    return v


async def _install_peers(dbs: dict[str, Database], peers: Peers) -> dict[str, Database]:
    """Install each installed peer's schema in its database; return those databases."""
    installed: dict[str, Database] = {}
    if peers.has("pgqueuer") and "pgqueuer" in dbs:
        installed["pgqueuer"] = dbs["pgqueuer"]
        await pgqueuer_install(dbs["pgqueuer"])
    if peers.has("procrastinate") and "procrastinate" in dbs:
        installed["procrastinate"] = dbs["procrastinate"]
        await procrastinate_install(dbs["procrastinate"])
    if peers.has("dbos") and "dbos" in dbs:
        installed["dbos"] = dbs["dbos"]
        await dbos_install(dbs["dbos"])
    return installed


#: The sections :func:`_bench` runs, in order (its progress lines count them).
_PHASES = (
    "statement overhead", "reserve with a budget", "statements through PgBouncer",
    "task cycle", "outbox relay", "claim scaling with rows", "claim scaling with tenants",
    "pickup latency", "agentdb against DBOS", "held snapshot",
)  # fmt: skip


def _progress(line: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    print(f"agentdb bench: {line}", file=sys.stderr, flush=True)


async def _bench(
    admin: str,
    dbs: dict[str, Database],
    scale: dict[int, Database],
    tenant_scale: dict[int, Database],
    opts: Options,
    sizes: Sizes,
    peers: Peers,
    notes: list[str],
) -> dict[str, Any]:
    probe = await Probe.open(admin)
    try:
        server, settings = await probe.server()
        if not probe.local:
            notes.append("server CPU is not reported: the server is not on this machine")
        peer_dbs = await _install_peers(dbs, peers)
        stamps: dict[str, float] = {}
        last = time.perf_counter()
        phases = iter(enumerate(_PHASES, 1))

        def lap(section: str) -> None:
            """Record ``section``'s seconds; say on stderr it is done and what runs next."""
            nonlocal last
            now = time.perf_counter()
            stamps[section], last = now - last, now
            _progress(f"{section}: done in {stamps[section]:.0f} s")
            following = next(phases, None)
            if following is not None:
                _progress(f"[{following[0]}/{len(_PHASES)}] {following[1]} ...")

        _progress(f"[1/{len(_PHASES)}] {next(phases)[1]} ...")
        agentdb = dbs["agentdb"]
        statements = await bench_statements(agentdb, sizes, opts.reps, probe)
        lap("statements")
        budget = await bench_budget(agentdb, sizes, opts.reps, probe)
        lap("budget")
        pooled = await _through_pgbouncer(admin, agentdb, sizes, opts.reps, probe, notes)
        lap("statements through pgbouncer")
        cycle = await bench_cycle(agentdb, peer_dbs, sizes, opts.reps, probe, notes)
        lap("cycle")
        relay = await bench_relay(agentdb, sizes, opts.reps, probe)
        lap("relay")
        scaling = await bench_scaling(scale, sizes, opts.reps)
        lap("scaling")
        tenant_scaling = await bench_tenant_scaling(tenant_scale, sizes, opts.reps)
        lap("scaling with tenants")
        pickup = await bench_pickup(dbs["pickup"], sizes.pickup_samples)
        lap("pickup latency")
        versus = await _versus(
            admin, dbs, peer_dbs, sizes, opts.reps, probe, notes, history=opts.history
        )
        lap("agentdb against DBOS")
        snapshot = await bench_snapshot(
            dbs["snapshot"], sizes.snapshot_seconds, offered_rate(cycle)
        )
        lap("held snapshot")
    finally:
        await probe.close()
    return {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "quick" if opts.quick else "full",
            "reps": opts.reps,
            "server": "embedded (pgserver)" if opts.dsn is None else _dsn.redact(opts.dsn),
            "settings": settings,
            "cpu_count": os.cpu_count() or 0,
            "machine": platform.machine(),
            "platform": platform.platform(terse=True),
            "versions": _versions(server, peers),
            "missing_peers": peers.missing,
            "section_seconds": stamps,
            "server_cpu_measured": probe.local,
        },
        "statements": statements,
        "budget": budget,
        "statements_pgbouncer": pooled,
        "cycle": cycle,
        "relay": relay,
        "scaling": scaling,
        "scaling_tenants": tenant_scaling,
        "pickup": pickup,
        "versus": versus,
        "snapshot": snapshot,
        "notes": notes,
    }


async def _versus(
    admin: str,
    dbs: dict[str, Database],
    peer_dbs: dict[str, Database],
    sizes: Sizes,
    reps: int,
    probe: Probe,
    notes: list[str],
    *,
    history: int = 0,
) -> dict[str, Any] | None:
    """agentdb against DBOS, when DBOS is installed (each in its own database)."""
    if "dbos" not in peer_dbs:
        notes.append("dbos is not installed: agentdb against DBOS is left out")
        return None
    return await bench_versus(
        dbs["versus"], peer_dbs["dbos"], sizes, reps, probe, admin, notes, history=history
    )


async def _bench_versus_only(
    admin: str, dbs: dict[str, Database], opts: Options, sizes: Sizes, peers: Peers,
    notes: list[str],
) -> dict[str, Any]:  # fmt: skip
    """Only agentdb against DBOS (``--dbos-only``; ``--wal-breakdown``: one repetition)."""
    probe = await Probe.open(admin)
    try:
        server, settings = await probe.server()
        if not probe.local:
            notes.append("server CPU is not reported: the server is not on this machine")
        peer_dbs = await _install_peers(dbs, peers)
        _progress("agentdb against DBOS ...")
        versus = await _versus(
            admin, dbs, peer_dbs, sizes, opts.reps, probe, notes, history=opts.history
        )
    finally:
        await probe.close()
    return {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": ("quick " if opts.quick else "full ") + (
                "WAL breakdown" if opts.only == "wal" else "agentdb against DBOS only"),
            "reps": opts.reps,
            "server": "embedded (pgserver)" if opts.dsn is None else _dsn.redact(opts.dsn),
            "settings": settings,
            "cpu_count": os.cpu_count() or 0,
            "machine": platform.machine(),
            "platform": platform.platform(terse=True),
            "versions": _versions(server, peers),
            "missing_peers": peers.missing,
            "server_cpu_measured": probe.local,
        },
        "versus": versus,
        "notes": notes,
    }  # fmt: skip


async def _through_pgbouncer(
    admin: str, db: Database, sizes: Sizes, reps: int, probe: Probe, notes: list[str]
) -> list[dict[str, Any]]:
    """The statement pairs again through a local PgBouncer in transaction mode, when installed."""
    binary = find_binary()
    if binary is None:
        notes.append("pgbouncer is not installed: the through-the-proxy statements are left out")
        return []
    parts = urlsplit(admin)
    logins = {parts.username or "postgres": unquote(parts.password or "")}
    with pgbouncer(admin, logins, pool_size=sizes.stmt_conns, binary=binary) as bouncer:
        return await bench_statements(
            db, sizes, reps, probe, url=bouncer.url(db.url), pooler="transaction"
        )


def _citus(
    admin: str, dbs: Databases, sizes: Sizes, reps: int, notes: list[str]
) -> dict[str, Any] | None:
    """Citus against plain Postgres on the same box, when ``admin`` is a Citus coordinator."""
    workers = citus_workers(admin)
    if not workers:
        notes.append("the server is not a Citus coordinator: the Citus comparison is left out")
        return None
    plain = dbs.create(dbs.name("plain"))
    migrate_locked(admin, plain.url)
    with citus_database(dbs, workers) as citus_url:
        nodes = node_urls(citus_url, workers)
        found = run_async(lambda: bench_citus(citus_url, plain.url, sizes.citus_tasks, reps, nodes))
    found["nodes"] = len(workers) + 1
    return found


def _sizes(opts: Options) -> Sizes:
    """The sizes ``opts`` asks for.

    Raises:
        ConfigurationError: ``opts.reps`` is below 1.
    """
    if opts.reps < 1:
        raise ConfigurationError("--reps must be at least 1")
    if opts.only not in ("all", "dbos", "wal"):
        raise ConfigurationError(f"unknown section choice {opts.only!r}")
    if opts.history < 0:
        raise ConfigurationError("--history must be 0 or more")
    sizes = QUICK if opts.quick else FULL
    if opts.skip_1m and not opts.quick:
        sizes = replace(sizes, scale_large=SKIP_1M_LARGE)
    if opts.snapshot_seconds is not None:
        if not opts.snapshot_seconds >= 1:  # also NaN
            raise ConfigurationError("--snapshot-seconds must be at least 1")
        sizes = replace(sizes, snapshot_seconds=opts.snapshot_seconds)
    return sizes


def _first_notes(peers: Peers) -> list[str]:
    notes: list[str] = []
    if importlib.util.find_spec("opentelemetry") is not None:
        notes.append(
            "opentelemetry-api is installed; with no SDK configured the helpers skip their "
            "own spans and only read the (empty) current span for trace ids"
        )
    notes += [f"{name} is not importable ({why}): left out" for name, why in peers.missing.items()]
    return notes


def _loadavg() -> list[float]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else [math.nan] * 3


def run(opts: Options) -> dict[str, Any]:
    """Run every comparison, write the report, and return the results.

    Raises:
        ConfigurationError: ``--reps`` below 1, or ``--dsn`` not a postgresql:// URL.
        DatabaseUnavailable: the server cannot be reached or refuses the login.
        psycopg.Error: a bench database could not be created or dropped.
    """
    sizes = _sizes(opts)
    if opts.only == "wal":
        opts = replace(opts, reps=1)
    peers = Peers()
    notes = _first_notes(peers)
    load_before = _loadavg()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # SIGTERM (timeout, a CI runner) unwinds like Ctrl-C: the scratch databases are
        # dropped, the embedded server stopped and its directory removed.
        stack.enter_context(sigterm_raises())
        if opts.dsn is None:
            from agentdb.tools.embedded import embedded_postgres

            admin = stack.enter_context(embedded_postgres(migrate=False))
        else:
            admin = opts.dsn
        dbs = Databases(admin, secrets.token_hex(4))
        stack.callback(dbs.drop_all)
        main_db = dbs.name("agentdb")
        created = {"agentdb": dbs.create(main_db)}
        migrate_locked(admin, created["agentdb"].url)
        # agentdb against DBOS: a database each, so each one's WAL can be read apart.
        created["versus"] = dbs.create(f"{main_db}_v", template=main_db)
        if peers.has("dbos"):
            created["dbos"] = dbs.create(dbs.name("dbos"))
        if opts.only != "all":
            results = run_async(
                lambda: _bench_versus_only(admin, created, opts, sizes, peers, notes)
            )
            results["meta"]["databases"] = list(dbs.created)
            return _finish(results, opts, t0, load_before)
        # Its own database: a worker there claims whatever is due, of any section.
        created["pickup"] = dbs.create(f"{main_db}_p", template=main_db)
        # Its own too: the snapshot it holds would hold back every other section's vacuum.
        created["snapshot"] = dbs.create(f"{main_db}_h", template=main_db)
        scale = {
            sizes.scale_small: dbs.create(f"{main_db}_s", template=main_db),
            sizes.scale_large: dbs.create(f"{main_db}_l", template=main_db),
        }
        for peer in ("pgqueuer", "procrastinate"):
            if peers.has(peer):
                created[peer] = dbs.create(dbs.name(peer))
        tenant_scale = {
            n: dbs.create(f"{main_db}_t{i}", template=main_db)
            for i, n in enumerate((sizes.tenants_small, sizes.tenants_large))
        }
        results = run_async(
            lambda: _bench(admin, created, scale, tenant_scale, opts, sizes, peers, notes)
        )
        results["citus"] = _citus(admin, dbs, sizes, opts.reps, results["notes"])
        results["meta"]["databases"] = list(dbs.created)  # all dropped on the way out
    return _finish(results, opts, t0, load_before)


def _finish(
    results: dict[str, Any], opts: Options, t0: float, load_before: list[float]
) -> dict[str, Any]:
    """Stamp the run's length and load, write the outputs; the results."""
    results["meta"]["seconds"] = time.perf_counter() - t0
    results["meta"]["load_before"] = load_before
    results["meta"]["load_after"] = _loadavg()
    write_outputs(results, opts.out)
    return results
