"""Which table plays which role, from ``--map`` or else from names and columns.

The audit works on schemas agentdb did not create. Tables play roles, found
from ``mapping`` (``--map tasks=my_jobs,operations=my_effects``) or else by
heuristics on names and columns:

* tasks: by what the columns do, whatever they are called
  (:mod:`agentdb.tools.audit.columns`): a state with a schedule (epoch
  numbers too), attempts, a version or a lease; a task/job name breaks ties;
* operations: another table with an idempotency key, or step outputs (a
  unique task reference + step id, with an output column);
* events: a name with ``event``/``audit``/``log``/``history``/``journal`` and
  an event column (``event_type``, ``type``, ``status``, ``actor_id``) or a
  task reference;
* outbox: a name with ``outbox``, or ``topic`` plus ``delivered_at``/``published_at``;
* inbox: a name with ``inbox``, or ``message_id`` plus ``consumer``;
* credentials: a name with ``credential`` or ``secret``;
* tenants: the table the tenant column's foreign keys point at.

The tenant column is ``tenant_id`` unless ``mapping["tenant"]`` names another.
A table is *tenant-owned* when it has that column and is one of the tables
above, has row-level security, has the column in a key, or is linked by a
foreign key to a task/operation/event/outbox table; a table that merely
carries the column (a role -> tenant lookup keyed by role) is not. When no
table has the tenant column the schema is single-tenant (said once, in a note),
unless a column such as ``org_id`` may be the tenant: the note then names it
and the ``--map tenant=`` to run again with.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from agentdb.errors import ConfigurationError
from agentdb.tools.audit import columns
from agentdb.tools.audit.catalog import Catalog, Table
from agentdb.tools.audit.report import KINDS, TableRef

__all__ = [
    "DELIVERED",
    "HASH",
    "LEASE_EXPIRES",
    "LEASE_OWNER",
    "MAP_KEYS",
    "MESSAGE_ID",
    "OP_KEY",
    "STATE",
    "VERSION",
    "WAKE",
    "Context",
    "detect",
    "parse_mapping",
]

#: Keys ``mapping`` / ``--map`` accepts: a table per role, and the tenant column.
MAP_KEYS: Final[tuple[str, ...]] = (*KINDS, "tenant")
#: A ``--map`` value that says "this schema has no such table" (stops the heuristics).
_NONE: Final = "-"

# Column names that give a table its role, most specific first; the checks
# then look for the same columns in it.
STATE = ("state", "status")
VERSION = ("state_version", "version", "lock_version", "row_version", "revision")
WAKE = (
    "wake_at",
    "run_at",
    "scheduled_at",
    "available_at",
    "not_before",
    "next_run_at",
    "execute_after",
    "start_after",
)
LEASE_OWNER = ("lease_owner", "locked_by", "claimed_by", "leased_by", "lease_holder", "worker_id")
LEASE_EXPIRES = (
    "lease_expires_at",
    "lease_expires",
    "lease_until",
    "locked_until",
    "claim_expires_at",
    "lease_deadline",
)
OP_KEY = ("idempotency_key", "idem_key", "idempotency_token")
HASH = ("input_hash", "request_hash", "params_hash", "payload_hash", "args_hash", "fingerprint")
DELIVERED = ("delivered_at", "published_at", "sent_at", "published")
MESSAGE_ID = ("message_id", "msg_id", "event_id")
_EVENT_MARK = ("event_type", "event_name", "actor", "actor_id", "actor_type")
_TOPIC = ("topic", "channel", "routing_key", "destination")
_CONSUMER = ("consumer", "consumer_name", "subscriber", "handler")
_TASK_NAME = re.compile(r"(^|_)(tasks?|jobs?|workflows?)($|_)")
_OP_NAME = re.compile(r"operation|effect|action|call|step")
_EVENT_NAME = re.compile(r"(^|_)(events?|audits?|audit_log|logs?|histor(y|ies)|journal)($|_)")
_CREDENTIAL_NAME = re.compile(r"credential|secret")
# What a SaaS schema calls its tenant when not tenant_id: named, not assumed (--map tenant=).
_TENANT_LIKE = (
    "org_id", "organization_id", "organisation_id", "account_id", "workspace_id", "team_id",
    "company_id", "customer_id",
)  # fmt: skip


@dataclass(slots=True)
class Context:
    """The catalog with each role's table decided: what every check reads.

    Attributes:
        cat: the snapshot.
        tc: the tenant column's name.
        kinds: the table playing each role of :data:`KINDS`, ``None`` if none does.
        refs: the same as the report names them, in :data:`KINDS` order.
        tenants_oid: the table the tenant column references, even outside the schema.
        owned: the tenant-owned tables.
        notes: what the report says about how roles were chosen.
        single_tenant: no table has the tenant column (and none was mapped).
        tenant_candidate: then, a column that may be the tenant under another name.
    """

    cat: Catalog
    tc: str
    kinds: dict[str, Table | None]
    refs: dict[str, TableRef | None]
    tenants_oid: int | None
    owned: list[Table]
    notes: list[str]
    single_tenant: bool = False
    tenant_candidate: str | None = None

    @property
    def scope(self) -> tuple[str, ...]:
        """The columns a key is unique within: the tenant column, or none in a
        single-tenant schema."""
        return () if self.single_tenant else (self.tc,)

    @property
    def tasks(self) -> Table | None:
        return self.kinds["tasks"]

    @property
    def ops(self) -> Table | None:
        return self.kinds["operations"]

    @property
    def events(self) -> Table | None:
        return self.kinds["events"]

    @property
    def outbox(self) -> Table | None:
        return self.kinds["outbox"]

    def stateful(self) -> list[tuple[str, Table]]:
        """The task, operation and outbox tables there are, with their role."""
        return [
            (kind, t)
            for kind in ("tasks", "operations", "outbox")
            if (t := self.kinds[kind]) is not None
        ]

    def tenants_display(self) -> str:
        """The tenants table as a fix names it (``tenants`` when there is none)."""
        t = self.kinds.get("tenants")
        return t.display if t is not None else _display_of(self.cat, self.tenants_oid)


def detect(cat: Catalog, mapping: Mapping[str, str]) -> Context:
    """Give every role of :data:`KINDS` its table: the mapped one, else the best guess.

    Raises:
        ConfigurationError: ``mapping`` has an unknown key, or names a table or
            tenant column the schema does not have.
    """
    _check_mapping(cat, mapping)
    tc = mapping.get("tenant", "tenant_id")
    notes: list[str] = []
    kinds, refs = _roles(cat, mapping, notes)
    tenants_oid = _tenants_oid(cat, mapping, tc, kinds, refs, notes)
    owned = [t for t in cat.tables.values() if _tenant_owned(t, tc, tenants_oid, kinds)]
    # No table carries the tenant column at all: the schema serves one tenant.
    # Said once here; the tenancy guarantees are marked, not judged, per row.
    single = "tenant" not in mapping and not any(tc in t.columns for t in cat.tables.values())
    candidate = _tenant_candidate(cat, kinds) if single else None
    if candidate is not None:
        carriers = sum(candidate in t.columns for t in cat.tables.values())
        notes.append(
            f"no table has a {tc} column, but {carriers} have {candidate}: if that is the "
            f"tenant, run again with --map tenant={candidate}; until then tenancy guarantees "
            "are not judged"
        )
    elif single:
        notes.append(
            f"single-tenant schema: no table has a {tc} column (--map tenant=COLUMN names "
            "one); tenancy guarantees are not applicable"
        )
    return Context(cat, tc, kinds, refs, tenants_oid, owned, notes, single, candidate)


def _tenant_candidate(cat: Catalog, kinds: Mapping[str, Table | None]) -> str | None:
    """A column that looks like a SaaS schema's tenant under another name (``org_id``...):
    the task table's if it has one, else the one most tables carry."""
    tasks = kinds.get("tasks")
    if tasks is not None:
        for name in _TENANT_LIKE:
            if name in tasks.columns:
                return name
    counts = Counter(n for t in cat.tables.values() for n in _TENANT_LIKE if n in t.columns)
    if not counts:
        return None
    return max(_TENANT_LIKE, key=lambda n: counts[n])


def _roles(
    cat: Catalog, mapping: Mapping[str, str], notes: list[str]
) -> tuple[dict[str, Table | None], dict[str, TableRef | None]]:
    kinds: dict[str, Table | None] = {}
    refs: dict[str, TableRef | None] = {}
    taken = {v for k, v in mapping.items() if k != "tenant" and v != _NONE}
    for kind in KINDS:
        if kind in mapping:
            value = mapping[kind]
            table = None if value == _NONE else cat.tables[value]
            kinds[kind] = table
            refs[kind] = None if table is None else TableRef(table.name, "map")
            continue
        if kind == "tenants":
            continue  # found from the tenant column's foreign keys, by _tenants_oid
        scored = [
            (score, t.name)
            for t in cat.tables.values()
            if t.name not in taken and (score := _score(kind, t, kinds, cat)) > 0
        ]
        scored.sort(key=lambda s: (-s[0], s[1]))
        if not scored:
            kinds[kind], refs[kind] = None, None
            continue
        best = cat.tables[scored[0][1]]
        if len(scored) > 1 and scored[1][0] == scored[0][0]:
            others = ", ".join(n for s, n in scored[1:] if s == scored[0][0])
            notes.append(
                f"{kind}: {best.name} chosen over {others} (equal heuristic score); "
                f"--map {kind}=TABLE picks another"
            )
        taken.add(best.name)
        kinds[kind], refs[kind] = best, TableRef(best.name, "heuristic")
    if "tenants" not in mapping:
        kinds["tenants"], refs["tenants"] = None, None
    return kinds, {k: refs.get(k) for k in KINDS}


def _score(kind: str, t: Table, kinds: Mapping[str, Table | None], cat: Catalog) -> int:
    """How much ``t`` looks like the ``kind`` table (0: not at all); ``kinds`` so far."""
    name = t.name.lower()
    if kind == "tasks":
        return _task_score(cat, t)
    if kind == "operations":
        tasks = kinds.get("tasks")
        links = tasks is not None and any(fk.ref_oid == tasks.oid for fk in t.of("f"))
        if columns.op_key(t) is not None:
            return 3 + 2 * bool(_OP_NAME.search(name)) + links + (t.col(*HASH) is not None)
        # A step-output table: a unique (task reference, step id) and an output.
        if columns.step_key(t, tasks) is not None and columns.has_output(t):
            return 3 + links
        return 0
    if kind == "events":
        return _event_score(t, kinds.get("tasks"))
    if kind == "outbox":
        if "outbox" in name:
            return 3
        return 2 if t.col(*_TOPIC) and t.col(*DELIVERED) else 0
    if kind == "inbox":
        if "inbox" in name:
            return 3
        return 2 if t.col(*MESSAGE_ID) and t.col(*_CONSUMER) else 0
    if kind == "credentials":
        return 1 if _CREDENTIAL_NAME.search(name) else 0
    return 0


def _task_score(cat: Catalog, t: Table) -> int:
    """Tasks are found by what they do - a state, a schedule, attempts, a lease -
    whatever the columns are called; a task/job name only breaks ties."""
    named = _TASK_NAME.search(t.name.lower()) is not None
    state, wake, tries = columns.state(t), columns.wake(t), columns.attempts(t)
    lease = columns.lease(cat, t)
    leased = lease.takeover is not None or lease.owner is not None
    version = columns.version(t)
    # A table holding idempotency keys is an operation unless its name says task/job.
    if not named and columns.op_key(t) is not None:
        return 0
    shaped = (state is not None and (wake or tries or leased or version)) or bool(wake and tries)
    if not shaped and not (named and (state or wake or tries or leased)):
        return 0
    return (
        2 * named
        + 2 * (state is not None)
        + 2 * (wake is not None)
        + 2 * (tries is not None)
        + (columns.max_attempts(t) is not None)
        + (lease.owner is not None)
        + (lease.takeover is not None)
        + (version is not None)
        + (columns.dedupe_key(t) is not None)
    )


def _event_score(t: Table, tasks: Table | None) -> int:
    """Events, logs and histories: an event-like name with an event column
    (``event_type``, ``type``, ``status``, ``actor``) or a task reference."""
    if tasks is not None and t.oid == tasks.oid:
        return 0
    # A key -> value store ("workflow events" one sets and reads back) keeps
    # the latest value per key: not a record of what happened.
    if "key" in t.columns and "value" in t.columns:
        return 0
    named = _EVENT_NAME.search(t.name.lower()) is not None
    marks = sum(c in t.columns for c in _EVENT_MARK)
    typed = t.col("type", "kind", "event", "action") is not None or columns.state(t) is not None
    ref = bool(columns.task_ref(t, tasks))
    if not named and not (marks and ref):
        return 0
    if not (marks or typed or ref):
        return 0
    return 1 + marks + typed + 2 * ref + ("payload" in t.columns)


def _tenants_oid(
    cat: Catalog,
    mapping: Mapping[str, str],
    tc: str,
    kinds: dict[str, Table | None],
    refs: dict[str, TableRef | None],
    notes: list[str],
) -> int | None:
    """The tenants table's oid; a guessed one inside the schema is recorded in ``kinds``."""
    mapped = kinds.get("tenants")
    if mapped is not None:
        return mapped.oid
    if "tenants" in mapping:
        return None
    targets = Counter(
        fk.ref_oid for t in cat.tables.values() for fk in t.of("f") if fk.columns == (tc,)
    )
    if not targets:
        return None
    oid = targets.most_common(1)[0][0]
    table = cat.by_oid(oid)
    if table is not None:
        kinds["tenants"] = table
        refs["tenants"] = TableRef(table.name, "heuristic")
    else:
        notes.append(f"tenants: {_display_of(cat, oid)} (outside this schema)")
    return oid


def _display_of(cat: Catalog, oid: int | None) -> str:
    """A table outside the schema as the foreign keys that reference it name it."""
    for table in cat.tables.values():
        for fk in table.of("f"):
            if fk.ref_oid == oid:
                return fk.ref_display
    return "tenants"


def _tenant_owned(
    t: Table, tc: str, tenants_oid: int | None, kinds: Mapping[str, Table | None]
) -> bool:
    if tc not in t.columns or t.oid == tenants_oid:
        return False
    # The tenants table is the anchor, not tenant data: a table whose only
    # link is a foreign key to it (a role -> tenant lookup) is not owned.
    kind_oids = {k.oid for kind, k in kinds.items() if k is not None and kind != "tenants"}
    if t.oid in kind_oids or t.rls:
        return True
    if any(tc in cols for _, cols, _ in t.unique_keys()) or (
        t.pk is not None and tc in t.pk.columns
    ):
        return True
    for fk in t.of("f"):
        if fk.ref_oid in kind_oids or (tc in fk.columns and len(fk.columns) > 1):
            return True
    return any(
        fk.ref_oid == t.oid
        for kind, k in kinds.items()
        if k is not None and kind != "tenants"
        for fk in k.of("f")
    )


# --- mapping ----------------------------------------------------------------------


def parse_mapping(specs: Iterable[str]) -> dict[str, str]:
    """Parse ``--map`` values (``"tasks=my_jobs,operations=my_effects"``, repeatable).

    A table of ``-`` says the schema has no such table. ``tenant=COLUMN``
    names the tenant column.

    Raises:
        ConfigurationError: an entry is not ``KEY=VALUE``, the key is unknown, or repeated.
    """
    mapping: dict[str, str] = {}
    for spec in specs:
        for entry in spec.split(","):
            entry = entry.strip()
            if not entry:
                continue
            key, sep, value = entry.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise ConfigurationError(f"--map entry {entry!r} must be KEY=TABLE")
            _check_key(key)
            if key in mapping:
                raise ConfigurationError(f"--map names {key!r} twice")
            mapping[key] = value
    return mapping


def _check_key(key: str) -> None:
    if key not in MAP_KEYS:
        raise ConfigurationError(f"--map key {key!r} is unknown; use {', '.join(MAP_KEYS)}")


def _check_mapping(cat: Catalog, mapping: Mapping[str, str]) -> None:
    for key, value in mapping.items():
        _check_key(key)
        if key == "tenant":
            if not any(value in t.columns for t in cat.tables.values()):
                raise ConfigurationError(
                    f"--map tenant={value}: no table in schema {cat.schema!r} "
                    f"has a column {value!r}"
                )
        elif value != _NONE and value not in cat.tables:
            raise ConfigurationError(
                f"--map {key}={value}: no table {value!r} in schema {cat.schema!r}"
            )
    _check_mapped_columns(cat, mapping)


def _check_mapped_columns(cat: Catalog, mapping: Mapping[str, str]) -> None:
    """A mapped table must have the columns its role is judged by.

    Raises:
        ConfigurationError: a mapped operation table has no idempotency key (nor a
            unique task reference + step id), or a mapped inbox no message id.
    """
    tasks_name = mapping.get("tasks")
    tasks = cat.tables.get(tasks_name) if tasks_name and tasks_name != _NONE else None
    ops_name = mapping.get("operations", _NONE)
    if ops_name != _NONE:
        ops = cat.tables[ops_name]
        if columns.op_key(ops) is None and columns.step_key(ops, tasks) is None:
            raise ConfigurationError(
                f"--map operations={ops_name}: {ops_name} has no idempotency key column "
                f"(idempotency_key, idem_key, idempotency_token) nor a unique "
                "(task reference, step id) key"
            )
    inbox_name = mapping.get("inbox", _NONE)
    if inbox_name != _NONE and cat.tables[inbox_name].col(*MESSAGE_ID) is None:
        raise ConfigurationError(
            f"--map inbox={inbox_name}: {inbox_name} has no message id column "
            f"({', '.join(MESSAGE_ID)})"
        )
