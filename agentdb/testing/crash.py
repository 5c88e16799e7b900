"""Crash-test a user's handler: the crash matrix, with real worker processes and SIGKILL.

:func:`crash_test` runs the user's handlers as ``agentdb worker MODULE:ATTR``
processes (started by the demo's :func:`~agentdb.tools.demo.fleet.spawn_cli`),
once without faults (the baseline) and then once per fault point
(:mod:`agentdb._faults`), each in a tenant of its own:

1. the tasks are created (lease TTL 1 s, so a dead worker's lease expires soon);
2. a worker is started with that one point armed at probability 1: it SIGKILLs
   itself the first time it gets there - ``during_call`` is the user's own
   provider call (:func:`~agentdb.testing.provider.at_provider_call`);
3. a fresh worker, unarmed, takes the tasks over once the lease expired and
   finishes them;
4. the provider's ledger for that scenario is compared with the baseline's.

A scenario fails when an effect was performed more often than in the baseline
(the step the worker died at was not idempotent), an effect is missing, a
repeat request was answered from its key although agentdb's ledger had already
recorded that operation succeeded (a blind call the key hid), or the tasks did
not end as in the baseline. :class:`NotIdempotent` names each failing step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from agentdb import _db, tasks, tenancy
from agentdb._faults import MEANING
from agentdb.errors import AgentDBError
from agentdb.hashing import canonical_json
from agentdb.testing._postgres import Database
from agentdb.testing.provider import (
    DSN_ENV,
    SCENARIO_ENV,
    ProviderCall,
    ProviderLedger,
    install,
)
from agentdb.tools._process import stop
from agentdb.tools.demo.fleet import kills_by_point, spawn_cli

__all__ = [
    "WORKER_POINTS",
    "CrashReport",
    "CrashTestError",
    "NotIdempotent",
    "Scenario",
    "crash_test",
]

#: The fault points a handler's worker passes (the relay's are not the handler's business).
WORKER_POINTS = tuple(p for p in MEANING if MEANING[p].startswith(("worker", "provider")))
_TERMINAL = ("succeeded", "failed", "dead", "cancelled")
_STATES = "SELECT id, state, last_error FROM agent_tasks WHERE tenant_id = $1"
# When each operation of the tenant was first recorded succeeded (settled or reconciled).
_SUCCEEDED_AT = (
    "SELECT o.idempotency_key, min(e.created_at) AS at FROM agent_operations o"
    " JOIN agent_events e ON e.tenant_id = o.tenant_id AND e.operation_id = o.id"
    " WHERE o.tenant_id = $1 AND e.to_state = 'succeeded' GROUP BY o.idempotency_key"
)


class CrashTestError(RuntimeError):
    """The crash matrix could not run (a worker would not start); the message quotes its log."""


class NotIdempotent(AssertionError):
    """A handler performed an effect twice (or lost one) when its worker was killed at a step."""


@dataclass(frozen=True)
class Scenario:
    """One run of the matrix: the point armed (``None`` for the baseline) and what came of it."""

    point: str | None
    #: The armed point was passed and the worker died there (else the run had no crash).
    killed: bool
    task_states: tuple[str, ...]
    #: (provider name, call) in arrival order.
    calls: tuple[tuple[str, ProviderCall], ...]
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        return self.point or "baseline"

    def describe(self) -> str:
        head = self.name if self.point is None else f"{self.point} ({MEANING[self.point]})"
        lines = [f"{head}:"] + [f"  {p}" for p in self.problems]
        lines += ["  provider calls, in order:"] + [
            f"    {name}: {c.describe()}" for name, c in self.calls
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class CrashReport:
    """Every scenario of one :func:`crash_test`."""

    baseline: Scenario
    scenarios: tuple[Scenario, ...]

    @property
    def ok(self) -> bool:
        return self.baseline.ok and all(s.ok for s in self.scenarios)

    @property
    def failed(self) -> tuple[str, ...]:
        """The steps (fault points) that were not idempotent."""
        return tuple(s.name for s in (self.baseline, *self.scenarios) if not s.ok)

    @property
    def not_reached(self) -> tuple[str, ...]:
        """Points the handler never passed (e.g. ``after_call`` without ``job.complete``)."""
        return tuple(s.name for s in self.scenarios if not s.killed)

    def __str__(self) -> str:
        rows = [
            f"  {s.name:<18} {'killed' if s.killed else 'not reached':<12} "
            f"{'ok' if s.ok else 'NOT IDEMPOTENT'}"
            for s in self.scenarios
        ]
        return "crash matrix:\n" + "\n".join(rows)


def _target(handlers: str | object) -> tuple[str, str | None]:
    """``MODULE:ATTR`` for ``handlers`` and the directory to import its module from.

    Raises:
        CrashTestError: ``handlers`` is an object no imported module holds by name.
    """
    if isinstance(handlers, str):
        return handlers, None
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or not path:
            continue
        for attr, value in list(vars(module).items()):
            if value is handlers:
                root = Path(path).resolve().parent
                for _ in range(name.count(".") + (Path(path).name == "__init__.py")):
                    root = root.parent
                return f"{name}:{attr}", str(root)
    raise CrashTestError(
        "the handlers must be a module-level name the worker process can import: "
        "define them at the top level of a module, or pass 'module:ATTRIBUTE'"
    )


def _identity(call: ProviderCall, provider: str, ids: Mapping[str, str]) -> str:
    """What makes two calls the same effect: provider, action and arguments, with the
    scenario's own task and tenant ids replaced so scenarios compare with the baseline."""
    text = canonical_json(dict(call.args)).decode()
    for raw, placeholder in ids.items():
        text = text.replace(raw, placeholder)
    return f"{provider}: {call.action}({text})"


@dataclass
class _Run:
    """What every scenario of one crash test shares: the database, the handlers, the files."""

    dsn: str
    spec: str
    pythonpath: str | None
    pooler: str | None
    workdir: Path
    log: IO[bytes]
    timeout: float

    def env(self, scenario: str, faults: str) -> dict[str, str]:
        env = dict(os.environ, DATABASE_URL=self.dsn, AGENTDB_FAULTS=faults)
        env[DSN_ENV] = self.dsn
        env[SCENARIO_ENV] = scenario
        env["AGENTDB_FAULTS_LOG"] = str(self.workdir / f"{scenario.replace('/', '_')}.faults")
        # Every point the workers pass, killed or not: from the baseline, the points the
        # handler reaches (a straight-line handler passes during_step, another does not).
        env["AGENTDB_FAULTS_TRACE"] = str(self.workdir / f"{scenario.replace('/', '_')}.trace")
        if self.pooler:
            env["AGENTDB_POOLER"] = self.pooler
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, (self.pythonpath, env.get("PYTHONPATH")))
            )
        return env

    def worker(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        return spawn_cli(
            ["worker", self.spec, "--dsn", self.dsn, "--concurrency", "1", "--poll-interval",
             "0.05", "--retry-base", "0.01", "--shutdown-grace", "1", "--log-level", "warning"],
            env, self.log,
        )  # fmt: skip

    def log_tail(self) -> str:
        self.log.flush()
        text = (self.workdir / "workers.log").read_text(errors="replace")
        return text[-3000:]


async def _until(
    pool: _db.Pool,
    tenant: uuid.UUID,
    ids: Sequence[uuid.UUID],
    proc: subprocess.Popen[bytes],
    deadline: float,
) -> bool:
    """Wait until the tasks ``ids`` are terminal (True) or ``proc`` ended (False). The
    children they spawn are the tenant's too; a parent finishes only after its own."""
    while time.monotonic() < deadline:
        rows = {r["id"]: r["state"] for r in await pool.fetch(_STATES, tenant)}
        if all(rows.get(i) in _TERMINAL for i in ids):
            return True
        if proc.poll() is not None:
            return False
        await asyncio.sleep(0.05)
    return False


async def _scenario(
    run: _Run,
    pool: _db.Pool,
    point: str | None,
    work: Sequence[tuple[str, Mapping[str, Any]]],
    providers: Sequence[ProviderLedger],
    tag: str,
) -> tuple[Scenario, uuid.UUID, list[uuid.UUID]]:
    name = point or "baseline"
    scenario = f"{tag}/{name}"
    tenant = await tenancy.create_tenant(pool, f"crash-{tag}-{name}-{uuid.uuid4().hex[:8]}")
    ids = []
    for task_type, params in work:
        t = await tasks.create(
            pool, tenant, task_type, params=dict(params),
            lease_ttl=timedelta(seconds=1), max_attempts=25,
        )  # fmt: skip
        ids.append(t.id)
    env = run.env(scenario, f"{point}=1" if point else "")
    deadline = time.monotonic() + run.timeout
    first = run.worker(env)
    try:
        done = await _until(pool, tenant, ids, first, deadline)
    finally:
        stop(first)
    killed = bool(kills_by_point(Path(env["AGENTDB_FAULTS_LOG"])))
    if not done and not killed and time.monotonic() < deadline:
        raise CrashTestError(
            f"{name}: the worker exited with {first.returncode} before finishing:\n{run.log_tail()}"
        )
    problems: list[str] = []
    if killed:
        recovery = run.worker(run.env(scenario, ""))
        try:
            done = await _until(pool, tenant, ids, recovery, deadline)
        finally:
            stop(recovery)
    rows = {r["id"]: r for r in await pool.fetch(_STATES, tenant)}
    if not done:
        left = [f"{i} {rows[i]['state']} ({rows[i]['last_error']})" for i in ids]
        problems.append(
            f"the tasks did not finish within {run.timeout:g}s of the start: {', '.join(left)}"
            " (an operation declared MANUAL whose outcome a crash left unknown waits for an"
            " operator: give its action a reconcile hook, reconcilers={action:"
            " provider.lookup}, or let its provider be called again with its key)"
        )
        await _cancel_unfinished(pool, tenant, ids)
    calls: list[tuple[str, ProviderCall]] = []
    for p in providers:
        name_of = str(getattr(p, "name", type(p).__name__))
        calls += [(name_of, c) for c in await p.calls(pool, scenario)]
    calls.sort(key=lambda nc: nc[1].at)
    states = tuple(str(rows[i]["state"]) for i in ids)
    return Scenario(point, killed, states, tuple(calls), tuple(problems)), tenant, ids


async def _cancel_unfinished(pool: _db.Pool, tenant: uuid.UUID, ids: Sequence[uuid.UUID]) -> None:
    """Cancel what a failed scenario left unfinished, so the next scenario's workers do not
    run it (and record its calls under their own scenario)."""
    for task_id in ids:
        with contextlib.suppress(AgentDBError):  # finished or moved meanwhile: nothing to do
            t = await tasks.get(pool, tenant, task_id)
            if t.state not in _TERMINAL:
                await tasks.transition(
                    pool, tenant, task_id, expected_version=t.state_version,
                    to_state="cancelled", error="crash test: unfinished at the end of its scenario",
                )  # fmt: skip


async def _blind_repeats(pool: _db.Pool, s: Scenario, tenant: uuid.UUID) -> list[str]:
    """Repeat calls answered from their key after agentdb had recorded that operation done."""
    done = {r["idempotency_key"]: r["at"] for r in await pool.fetch(_SUCCEEDED_AT, tenant)}
    return [
        f"{name}: {c.describe()} came after agentdb had recorded operation"
        f" {c.idempotency_key!r} succeeded: the handler called again without checking"
        " Reservation.fresh"
        for name, c in s.calls
        if c.outcome == "replayed" and c.idempotency_key in done and done[c.idempotency_key] < c.at
    ]


def _judge(s: Scenario, base: Scenario, effects: Counter[str], baseline: Counter[str]) -> list[str]:
    problems = list(s.problems)
    step = "without a crash" if s.point is None else f"when the worker was killed at {s.point}"
    for effect, n in sorted((effects - baseline).items()):
        problems.append(
            f"{effect} was performed {n + baseline[effect]} time(s) {step}, "
            f"{baseline[effect]} without a crash: the step is not idempotent"
        )
    for effect, n in sorted((baseline - effects).items()):
        problems.append(f"{effect} was performed {n} time(s) fewer {step} than without a crash")
    if s.task_states != base.task_states and not s.problems:
        problems.append(
            f"the tasks ended {list(s.task_states)}, without a crash {list(base.task_states)}"
        )
    return problems


async def crash_test(
    db: Database | str,
    handlers: str | object,
    work: Sequence[tuple[str, Mapping[str, Any]]],
    providers: ProviderLedger | Sequence[ProviderLedger],
    *,
    points: Sequence[str] | None = None,
    within: float = 60.0,
    pooler: str | None = None,
    check: bool = True,
) -> CrashReport:
    """Run ``handlers`` under the crash matrix and check each provider saw every effect once.

    ``db``: a migrated database (the ``agentdb_db`` fixture, or a DSN whose login
    may create the provider ledger's schema). ``handlers``: the dict (or object
    with ``.handlers`` / ``.reconcilers``) at the top level of an importable
    module, or its ``"module:ATTR"``. ``work``: the tasks each scenario creates,
    as ``(task_type, params)``. ``providers``: the fakes the handlers call
    (:class:`~agentdb.testing.RecordingProvider`, or your own
    :class:`~agentdb.testing.provider.ProviderLedger`). ``within``: seconds
    per scenario. ``pooler``: ``"transaction"`` behind PgBouncer.

    Raises:
        NotIdempotent: with ``check``, a scenario failed; the message names each
            step, what the provider did too often (or not at all) and its calls.
        CrashTestError: a worker process could not run the handlers (its log is quoted).
        ValueError: an unknown point.
    """
    unknown = [p for p in points or () if p not in WORKER_POINTS]
    if unknown:
        raise ValueError(f"unknown worker fault point(s) {unknown}; known: {list(WORKER_POINTS)}")
    ledgers = [providers] if not isinstance(providers, Sequence) else list(providers)
    spec, path = _target(handlers)
    dsn = db.dsn if isinstance(db, Database) else db
    tag = uuid.uuid4().hex[:8]
    pool = await _db.create_pool(dsn, min_size=1, max_size=2, pooler=pooler)
    try:
        await install(pool)
        # The workers' log: written by the processes, read only to quote a failure.
        with (
            tempfile.TemporaryDirectory(prefix="agentdb-crash-") as tmp,
            open(Path(tmp) / "workers.log", "ab") as log,  # noqa: ASYNC230
        ):
            run = _Run(dsn, spec, path, pooler, Path(tmp), log, within)
            base, base_tenant, base_ids = await _scenario(run, pool, None, work, ledgers, tag)
            if points is None:  # each point the handler reaches without a crash
                reached = _traced(Path(run.env(f"{tag}/baseline", "")["AGENTDB_FAULTS_TRACE"]))
                points = [p for p in WORKER_POINTS if p in reached]
            base_effects = _effects(base, base_tenant, base_ids)
            base = _with(base, _judge(base, base, base_effects, base_effects)
                         + await _blind_repeats(pool, base, base_tenant))  # fmt: skip
            found = []
            for point in points:
                s, tenant, ids = await _scenario(run, pool, point, work, ledgers, tag)
                problems = _judge(s, base, _effects(s, tenant, ids), base_effects)
                found.append(_with(s, problems + await _blind_repeats(pool, s, tenant)))
    finally:
        await pool.close()
    report = CrashReport(base, tuple(found))
    if check and not report.ok:
        failing = [s for s in (report.baseline, *report.scenarios) if not s.ok]
        raise NotIdempotent(
            f"not idempotent at {', '.join(s.name for s in failing)} "
            f"({len(failing)} of {len(report.scenarios) + 1} runs):\n"
            + "\n".join(s.describe() for s in failing)
            + f"\n{report}"
        )
    return report


def _traced(path: Path) -> set[str]:
    """The points a run's workers passed (AGENTDB_FAULTS_TRACE), none if it wrote nothing."""
    try:
        return set(path.read_text().split())
    except FileNotFoundError:
        return set()


def _effects(s: Scenario, tenant: uuid.UUID, ids: Sequence[uuid.UUID]) -> Counter[str]:
    names = {str(tenant): "<tenant>", **{str(t): f"<task {i}>" for i, t in enumerate(ids)}}
    return Counter(_identity(c, p, names) for p, c in s.calls if c.outcome == "executed")


def _with(s: Scenario, problems: list[str]) -> Scenario:
    return Scenario(s.point, s.killed, s.task_states, s.calls, tuple(problems))
