"""Retention: purge what is past its retention, in small batches (G9).

=================  =====================================================  ==========
class              what goes                                               default
=================  =====================================================  ==========
event_payloads     event payloads past ``payload_expires_at`` (erased)     per row, 30 days
events             audit events past ``retain_until`` (deleted)            per row, 400 days
outbox_delivered   delivered outbox rows                                   7 days
inbox              consumer inbox rows                                     30 days
operations         settled operations no event or artifact refers to       30 days
signals            signals of finished tasks whose events are gone         as tasks
tasks              finished tasks with nothing left referring to them      30 days
=================  =====================================================  ==========

Event retention is set per row when the event is written (the columns); the
other classes take their age at purge time. Where the audit trail is
partitioned by month (opt-in, ``agentdb migrate --events-by-month``), a purge
that includes ``events`` first drops every month that is over and holds no retained row - one DROP
instead of a delete per row - and creates the months ahead. Rows of a month
that still holds a retained one are deleted row by row, as before. Each batch is one statement in
its own transaction, so locks are held briefly, live claims skip nothing
they need (purge uses SKIP LOCKED too) and an interrupted purge resumes.
Dead outbox messages are never purged: an operator must look at them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from agentdb import _db
from agentdb._citus.routing import distributed
from agentdb.errors import ConfigurationError

__all__ = ["CLASSES", "DEFAULT_AGES", "MONTHS_AHEAD", "Partition", "PurgeReport", "purge"]

_Q = _db.queries(__name__)
#: In dependency order: payloads and events first, so operations and tasks
#: whose audit trail expired can go in the same run.
CLASSES = (
    "event_payloads",
    "events",
    "outbox_delivered",
    "inbox",
    "operations",
    "signals",
    "tasks",
)
DEFAULT_AGES: Mapping[str, timedelta] = {
    "event_payloads": timedelta(0),
    "events": timedelta(0),
    "outbox_delivered": timedelta(days=7),
    "inbox": timedelta(days=30),
    "operations": timedelta(days=30),
    # A task's signals go with it: at its age (unless given their own), just before it.
    "signals": timedelta(days=30),
    "tasks": timedelta(days=30),
}


#: Month partitions of agent_events kept ready ahead of the current month.
MONTHS_AHEAD = 2


@dataclass(frozen=True, slots=True)
class Partition:
    """What a purge did to one month partition of agent_events."""

    name: str
    action: str  # 'created', 'left in place', 'dropped', 'busy, skipped'
    events: int  # the rows a drop removed (0 otherwise)


@dataclass
class PurgeReport:
    """Rows removed per class, statements run, and the longest single statement.

    ``removed["events"]`` counts the rows of dropped months too; ``partitions``
    says what happened to each month partition (what was created ahead, dropped,
    or skipped because a lock was not granted in time).
    """

    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    partitions: list[Partition] = field(default_factory=list)
    statements: int = 0
    longest_statement: float = 0.0
    elapsed: float = 0.0


async def purge(
    db: _db.Executor,
    *,
    batch: int = 1000,
    ages: Mapping[str, timedelta] | None = None,
    classes: tuple[str, ...] = CLASSES,
    progress: Callable[[str, int], None] | None = None,
) -> PurgeReport:
    """Purge every class in ``classes`` until nothing past retention is left.

    Run it as the schema owner (or a role granted EXECUTE on ``agentdb_purge``).

    Raises:
        ConfigurationError: an unknown class or a batch outside 1..100000
            (mapped from SQLSTATE 22023).
        asyncpg.InsufficientPrivilegeError: the role may not purge (SQLSTATE 42501).
    """
    unknown = set(classes) - set(CLASSES)
    if unknown:
        raise ConfigurationError(f"unknown retention class(es): {', '.join(sorted(unknown))}")
    if not 1 <= batch <= 100000:
        raise ConfigurationError("batch must be between 1 and 100000")
    wanted = {**DEFAULT_AGES, **(ages or {})}
    if "signals" not in (ages or {}):
        wanted["signals"] = wanted["tasks"]  # a task's signals go at its age, just before it
    report = PurgeReport()
    started = time.perf_counter()
    if "events" in classes:
        # DDL: one call through the coordinator on Citus too.
        t0 = time.perf_counter()
        rows = await _db.fetch_many(db, _Q["event_partitions"], ahead=MONTHS_AHEAD)
        report.longest_statement = time.perf_counter() - t0
        report.statements += 1
        report.partitions = [Partition(r["partition_name"], r["action"], r["events"]) for r in rows]
        report.removed["events"] += sum(p.events for p in report.partitions)

    # On Citus the cross-tenant step is refused; each tenant's routes to its worker.
    scopes: list[uuid.UUID | None] = [None]
    if await distributed(db):
        # With no tenant at all, one step for the nil tenant still checks the
        # caller's privilege (and removes nothing).
        scopes = [r["tenant_id"] for r in await _db.fetch_many(db, _Q["purge_tenants"])]
        scopes = scopes or [uuid.UUID(int=0)]
    for kind, tenant in ((k, t) for k in classes for t in scopes):
        while True:
            t0 = time.perf_counter()
            if tenant is None:
                row = await _db.fetch_one(
                    db, _Q["purge_step"], kind=kind, batch=batch, older_than=wanted[kind]
                )
            else:
                row = await _db.fetch_one(
                    db, _Q["purge_tenant_step"], tenant_id=tenant, kind=kind, batch=batch,
                    older_than=wanted[kind],
                )  # fmt: skip
            report.longest_statement = max(report.longest_statement, time.perf_counter() - t0)
            report.statements += 1
            removed = int(row["removed"])
            report.removed[kind] += removed
            if progress is not None and removed:
                progress(kind, report.removed[kind])
            if removed < batch:
                break
    report.elapsed = time.perf_counter() - started
    return report
