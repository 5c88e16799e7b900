"""Which column of a table plays which part: state, schedule, attempts, lease, keys.

Schemas nobody here wrote name these columns their own way (``status``,
``start_after``, ``execute_after``, ``retry_count``, ``queue_manager_id``,
``locked_at``, ``singleton_key``, ``queueing_lock``, a wake-up time kept as
epoch milliseconds in a ``bigint``...). Each finder returns the column a
check judges, the most specific name first, else ``None``; the table
heuristics (:mod:`agentdb.tools.audit.detect`) and the checks read the same
answers, so a table is judged by the columns that made it a task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from agentdb.tools.audit.catalog import Catalog, Column, Table

__all__ = [
    "FINAL_STATES",
    "Lease",
    "attempts",
    "completion",
    "dedupe_key",
    "lease",
    "max_attempts",
    "op_key",
    "state",
    "step_key",
    "task_ref",
    "version",
    "wake",
]

_TIME_TYPES: Final = frozenset({"timestamptz", "timestamp", "date"})
_NUMBER_TYPES: Final = frozenset({"int2", "int4", "int8", "numeric", "float4", "float8"})
_TEXT_TYPES: Final = frozenset({"text", "varchar", "bpchar", "citext", "name", "uuid"})

# Most specific first: the first one a table has is the one judged.
_STATE_NAMES: Final = ("state", "status", "job_state", "job_status", "task_state", "task_status")
_STATE_SUFFIX = re.compile(r"^[a-z0-9_]*_(state|status)$")
_VERSION_NAMES: Final = (
    "state_version",
    "version",
    "lock_version",
    "row_version",
    "revision",
    "record_version",
)
# A wake-up / schedule time, in a time type or as an epoch number
# (``wake_at``, ``start_after``, ``execute_after``, ``run_at_epoch_ms``...).
_WAKE = re.compile(
    r"^(?:(?:wake(?:_up)?|run|scheduled?|available|visible|execute|start|due|deliver|"
    r"retry|eligible|process|resume|delay)_(?:at|after|on|time|until|from)"
    r"|next_run(?:_at|_time)?|next_attempt(?:_at)?|not_before|wake_up|wakeup_at)"
    r"(?:_epoch)?(?:_(?:ms|millis|milliseconds|s|sec|secs|seconds|us))?$"
)
_ATTEMPTS = re.compile(
    r"^(?:attempts?|attempt_count|attempt_number|num_attempts|retry_count|retries|"
    r"tries|try_count|recovery_attempts|retry_attempts|run_count|failure_count)$"
)
_MAX_ATTEMPTS = re.compile(
    r"^(?:max_attempts|max_retries|retry_limit|max_recovery_attempts|attempts_max|max_tries)$"
)
_OWNER = re.compile(
    r"^(?:lease_owner|lease_holder|locked_by|claimed_by|leased_by|picked_by|reserved_by|"
    r"taken_by|processed_by|lock_owner|owner|owner_id|worker|worker_id|executor_id|"
    r"queue_manager_id|runner_id|consumer_id|instance_id)$"
)
_EXPIRES = re.compile(
    r"^(?:lease_expires(?:_at)?|lease_until|lease_deadline|locked_until|lock_expires_at|"
    r"claim_expires_at|claimed_until|visible_until|visibility_timeout_at|lease_expiry)$"
)
_ACQUIRED = re.compile(
    r"^(?:locked_at|claimed_at|leased_at|picked_at|lease_acquired_at|acquired_at|"
    r"started_at|started_on|reserved_at)$"
)
_HEARTBEAT = re.compile(
    r"^(?:heartbeat|heartbeat_at|heartbeated_at|last_heartbeat|last_heartbeat_at|"
    r"alive_at|last_seen_at|pinged_at|last_ping_at)$"
)
_TTL = re.compile(r"^(?:expire_in|expire_seconds|lease_seconds|lease_ttl|timeout|timeout_seconds)$")
_TOKEN = ("lease_token", "fencing_token", "lease_epoch", "lease_generation", "claim_token")
_OP_KEY = ("idempotency_key", "idem_key", "idempotency_token", "idempotency_id")
_OP_KEY_PATTERN = re.compile(r"idempot")
_DEDUPE = (
    "dedupe_key",
    "dedup_key",
    "deduplication_key",
    "deduplication_id",
    "idempotency_key",
    "unique_key",
    "singleton_key",
    "queueing_lock",
    "job_key",
    "uniqueness_key",
)
_DEDUPE_PATTERN = re.compile(r"dedup|idempot|singleton|uniq")
_COMPLETION = re.compile(
    r"^(?:completed_(?:at|on)|finished_(?:at|on)|done_at|succeeded_at|ended_at|settled_at)$"
)
_TASK_REF = re.compile(r"^(?:task|job|workflow|run|work_item)_(?:id|uuid)$|^workflow_uuid$")
_STEP_ID = re.compile(
    r"^(?:function_id|step_id|step|step_name|step_index|step_number|function_name|"
    r"operation|action|call_id|seq|sequence)$"
)

#: State names that end a lifecycle, whoever spells them.
FINAL_STATES: Final = frozenset(
    {
        "succeeded",
        "success",
        "successful",
        "completed",
        "complete",
        "done",
        "finished",
        "failed",
        "failure",
        "error",
        "errored",
        "exception",
        "cancelled",
        "canceled",
        "aborted",
        "dead",
        "deleted",
        "expired",
        "archived",
        "discarded",
        "max_recovery_attempts_exceeded",
    }
)


def _first(
    t: Table, names: tuple[str, ...], pattern: re.Pattern[str] | None = None
) -> Column | None:
    found = t.col(*names)
    if found is not None or pattern is None:
        return found
    return next((c for c in t.columns.values() if pattern.search(c.name)), None)


def state(t: Table) -> Column | None:
    """The lifecycle state column (``state``, ``status``, ``<x>_status``...), not a boolean."""
    found = t.col(*_STATE_NAMES)
    if found is not None:
        return found
    return next(
        (
            c
            for c in t.columns.values()
            if _STATE_SUFFIX.match(c.name) and (c.base in _TEXT_TYPES or c.enum_labels)
        ),
        None,
    )


def version(t: Table) -> Column | None:
    """The optimistic-concurrency version column."""
    c = t.col(*_VERSION_NAMES)
    return c if c is not None and c.base in _NUMBER_TYPES else None


def wake(t: Table) -> Column | None:
    """The time a task may next run: a timestamp, or an epoch number in an integer column."""
    for c in t.columns.values():
        if _WAKE.match(c.name) and (c.base in _TIME_TYPES or c.base in _NUMBER_TYPES):
            return c
    return None


def attempts(t: Table) -> Column | None:
    """The attempt counter."""
    return next(
        (c for c in t.columns.values() if _ATTEMPTS.match(c.name) and c.base in _NUMBER_TYPES),
        None,
    )


def max_attempts(t: Table) -> Column | None:
    """The attempt limit."""
    return next(
        (c for c in t.columns.values() if _MAX_ATTEMPTS.match(c.name) and c.base in _NUMBER_TYPES),
        None,
    )


def completion(t: Table) -> Column | None:
    """A column that records when a task finished (rows kept after completion)."""
    return next((c for c in t.columns.values() if _COMPLETION.match(c.name)), None)


@dataclass(frozen=True, slots=True)
class Lease:
    """How a task table lets a worker hold a task and another take it over.

    Attributes:
        owner: the column naming the holder.
        expires: an expiry time on the row.
        acquired: when the holder took it (takeover after a timeout).
        heartbeat: where the holder's liveness is kept, as evidence names it
            (``t.heartbeat``, or ``workers.last_heartbeat`` through the owner's
            foreign key).
        ttl: a per-row lease length.
        token: a fencing token.
    """

    owner: Column | None
    expires: Column | None
    acquired: Column | None
    heartbeat: str | None
    ttl: Column | None
    token: Column | None

    @property
    def takeover(self) -> str | None:
        """What lets another worker take a task over, in words; ``None``: nothing does."""
        if self.expires is not None:
            return f"expiry {self.expires.name}"
        if self.heartbeat is not None:
            return f"heartbeat {self.heartbeat}"
        if self.acquired is not None and self.ttl is not None:
            return f"{self.acquired.name} + {self.ttl.name}"
        if self.acquired is not None:
            return f"a timeout on {self.acquired.name}"
        return None

    @property
    def columns(self) -> list[Column]:
        return [c for c in (self.owner, self.expires, self.acquired, self.ttl, self.token) if c]


def lease(cat: Catalog, t: Table) -> Lease:
    """The lease columns of ``t`` (a heartbeat may live in the owner's table)."""
    owner = next((c for c in t.columns.values() if _OWNER.match(c.name)), None)
    heartbeat: str | None = None
    beat = next((c for c in t.columns.values() if _HEARTBEAT.match(c.name)), None)
    if beat is not None:
        heartbeat = f"{t.name}.{beat.name}"
    elif owner is not None:
        for fk in t.of("f"):
            if owner.name in fk.columns and (parent := cat.by_oid(fk.ref_oid)) is not None:
                pbeat = next((c for c in parent.columns.values() if _HEARTBEAT.match(c.name)), None)
                if pbeat is not None:
                    heartbeat = f"{parent.name}.{pbeat.name}"
                    break
    return Lease(
        owner=owner,
        expires=next((c for c in t.columns.values() if _EXPIRES.match(c.name)), None),
        acquired=next((c for c in t.columns.values() if _ACQUIRED.match(c.name)), None),
        heartbeat=heartbeat,
        ttl=next((c for c in t.columns.values() if _TTL.match(c.name)), None),
        token=t.col(*_TOKEN),
    )


def op_key(t: Table) -> Column | None:
    """An operation's idempotency key column."""
    return _first(t, _OP_KEY, _OP_KEY_PATTERN)


def dedupe_key(t: Table) -> Column | None:
    """A task's dedupe key: a known name, or a text ``key`` column something makes unique."""
    found = _first(t, _DEDUPE, _DEDUPE_PATTERN)
    if found is not None and found.base in _TEXT_TYPES:
        return found
    key = t.columns.get("key")
    if key is not None and any("key" in cols for _, cols, _ in t.unique_keys()):
        return key
    return None


def task_ref(t: Table, tasks: Table | None) -> list[str]:
    """The columns of ``t`` that point at a task: a foreign key to ``tasks``, else by name."""
    if tasks is not None:
        for fk in t.of("f"):
            if fk.ref_oid == tasks.oid and fk.ref_oid != t.oid:
                return list(fk.columns)
    return [c.name for c in t.columns.values() if _TASK_REF.match(c.name)][:1]


def step_key(t: Table, tasks: Table | None) -> tuple[str, ...] | None:
    """A step-output table's operation key: a unique key made of a task reference and a
    step id (``(workflow_uuid, function_id)``), else ``None``."""
    refs = task_ref(t, tasks)
    if not refs:
        return None
    keys = list(t.unique_keys())
    if t.pk is not None:
        keys.append((t.pk.name, t.pk.columns, None))
    for _, cols, pred in keys:
        if pred is None and set(refs) <= set(cols) and any(_STEP_ID.match(c) for c in cols):
            return tuple(cols)
    return None


def has_output(t: Table) -> bool:
    """Does ``t`` record what a step produced?"""
    return any(c in t.columns for c in ("output", "result", "response", "error", "return_value"))
