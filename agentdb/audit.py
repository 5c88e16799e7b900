"""``agentdb audit``: which of the guarantees G1-G17 does an existing schema enforce?

The audit reads the live catalog of one schema (``pg_catalog`` only, inside a
READ ONLY transaction, so a role with no table privileges can run it and it
writes nothing) and reports one :class:`Finding` per guarantee:

* ``enforced`` - named constraints, triggers, policies or grants enforce it
  (``evidence`` names them);
* ``partial`` - part of it is enforced; ``problems`` says what is missing;
* ``missing`` - nothing in the schema enforces it;
* ``not_applicable`` - the schema has nothing the guarantee is about (G11
  when nothing is relayed through an outbox).

Every finding has a one-line ``reason`` and, unless enforced, a suggested
SQL ``fix`` (shown, never executed).

It works on schemas agentdb did not create. Tables play roles, found from
``mapping`` (``--map tasks=my_jobs,operations=my_effects``) or else by
heuristics on names and columns:

* tasks: a name with ``task``/``job`` in it, or a ``state``/``status`` column
  together with a schedule (``wake_at``, ``run_at``...), version or lease column;
* operations: another table with an ``idempotency_key`` column;
* events: a name with ``event``/``audit``/``log``/``history`` and an
  ``event_type`` or ``actor``/``actor_id`` column;
* outbox: a name with ``outbox``, or ``topic`` plus ``delivered_at``/``published_at``;
* inbox: a name with ``inbox``, or ``message_id`` plus ``consumer``;
* credentials: a name with ``credential`` or ``secret``;
* tenants: the table the tenant column's foreign keys point at.

The tenant column is ``tenant_id`` unless ``mapping["tenant"]`` names another.
A table is *tenant-owned* when it has that column and is one of the tables
above, has row-level security, has the column in a key, or is linked by a
foreign key to a task/operation/event/outbox table; a table that merely
carries the column (a role -> tenant lookup keyed by role) is not.

Usage::

    report = audit("postgresql://auditor@db/app", mapping={"tasks": "jobs"})
    assert report.exit_code("partial") == 0, report.render()
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Final, Literal, LiteralString, TypeAlias

import psycopg

from agentdb.errors import AgentDBError, ConfigurationError, DatabaseUnavailable
from agentdb.migrate import libpq_dsn, redact

__all__ = [
    "EXIT_FINDINGS",
    "JSON_SCHEMA",
    "MAP_KEYS",
    "STATUSES",
    "AuditError",
    "Finding",
    "Report",
    "TableRef",
    "audit",
    "parse_mapping",
    "register",
]

Status: TypeAlias = Literal["enforced", "partial", "missing", "not_applicable"]
STATUSES: Final[tuple[Status, ...]] = ("enforced", "partial", "missing", "not_applicable")
#: Exit status of ``agentdb audit --fail-on ...`` when a guarantee is below the bar
#: (1 is kept for database problems and 2 for bad input, as in every command).
EXIT_FINDINGS: Final = 3
#: Version of the JSON document :meth:`Report.to_json` writes; bumped on any
#: incompatible change to :data:`JSON_SCHEMA`.
REPORT_VERSION: Final = 1

_KINDS: Final = ("tasks", "operations", "events", "outbox", "inbox", "tenants", "credentials")
#: Keys ``mapping`` / ``--map`` accepts: a table per role, and the tenant column.
MAP_KEYS: Final[tuple[str, ...]] = (*_KINDS, "tenant")
#: A ``--map`` value that says "this schema has no such table" (stops the heuristics).
_NONE: Final = "-"

_TITLES: Final[Mapping[str, str]] = {
    "G1": "tasks and operations are separate",
    "G2": "no row points at another tenant's row",
    "G3": "one operation per key per tenant",
    "G4": "a key carries the hash of its request",
    "G5": "states and owners are always valid",
    "G6": "lifecycle moves only along allowed edges",
    "G7": "every state write moves a version",
    "G8": "state changes are audited, append-only",
    "G9": "payloads bounded, secret-free, retained",
    "G10": "outbox delivery is queryable",
    "G11": "consumers can deduplicate redeliveries",
    "G12": "fenced leases",
    "G13": "unsettled operations are findable",
    "G14": "policy facts are typed columns",
    "G15": "RLS and roles scope agents to a tenant",
    "G16": "trace and span ids",
    "G17": "tenant deletion policy, credential refs",
}

# Column names the heuristics look for, most specific first.
_STATE = ("state", "status")
_VERSION = ("state_version", "version", "lock_version", "row_version", "revision")
_WAKE = (
    "wake_at",
    "run_at",
    "scheduled_at",
    "available_at",
    "not_before",
    "next_run_at",
    "execute_after",
    "start_after",
)
_LEASE_OWNER = ("lease_owner", "locked_by", "claimed_by", "leased_by", "lease_holder", "worker_id")
_LEASE_EXPIRES = (
    "lease_expires_at",
    "lease_expires",
    "lease_until",
    "locked_until",
    "claim_expires_at",
    "lease_deadline",
)
_LEASE_TOKEN = ("lease_token", "fencing_token", "lease_epoch", "lease_generation", "claim_token")
_OP_KEY = ("idempotency_key", "idem_key", "idempotency_token")
_TASK_KEY = ("dedupe_key", "dedup_key", "idempotency_key", "unique_key")
_HASH = ("input_hash", "request_hash", "params_hash", "payload_hash", "args_hash", "fingerprint")
_RETENTION = (
    "retain_until",
    "retention_until",
    "payload_expires_at",
    "expires_at",
    "purge_after",
    "delete_after",
)
_EVENT_MARK = ("event_type", "event_name", "actor", "actor_id", "actor_type")
_TOPIC = ("topic", "channel", "routing_key", "destination")
_DELIVERED = ("delivered_at", "published_at", "sent_at", "published")
_NEXT_ATTEMPT = ("next_attempt_at", "available_at", "run_at", "scheduled_at")
_MESSAGE_ID = ("message_id", "msg_id", "event_id")
_CONSUMER = ("consumer", "consumer_name", "subscriber", "handler")
_TASK_REF = ("task_id", "job_id")
_OP_REF = ("operation_id", "op_id", "effect_id")
_UNSETTLED_ORDER = ("updated_at", "created_at", "id")
_UNKNOWN_STATES = frozenset(
    {"unknown", "indeterminate", "in_doubt", "uncertain", "needs_reconciliation", "reconciling"}
)
_TASK_NAME = re.compile(r"(^|_)(tasks?|jobs?)($|_)")
_OP_NAME = re.compile(r"operation|effect|action|call|step")
_EVENT_NAME = re.compile(r"(^|_)(events?|audits?|audit_log|logs?|history)($|_)")
_CREDENTIAL_NAME = re.compile(r"credential|secret")
_SECRET_COLUMN = re.compile(
    r"secret|token|passw|api_?key|credential|private_?key|(^|_)ref(erence)?($|_)|(^|_)value($|_)"
)
# A routine that deletes tenants is G17's evidence when there is one.
_DELETION_ROUTINE = re.compile(
    r"(delete|purge|erase|forget|offboard|remove|drop).*tenant"
    r"|tenant.*(delete|purge|erase|forget|offboard|remov)"
)

# pg_constraint.confdeltype values that make a delete do something implicit.
_DELETE_RULES: Final[Mapping[str, str]] = {
    "c": "CASCADE silently deletes",
    "n": "SET NULL orphans",
    "d": "SET DEFAULT re-parents",
}

# Placeholder state sets for fixes, taken from agentdb's own tables.
_STATE_SETS: Final[Mapping[str, str]] = {
    "tasks": "'pending', 'waiting', 'running', 'succeeded', 'failed', 'cancelled', 'dead'",
    "operations": "'reserved', 'in_flight', 'succeeded', 'failed', 'unknown'",
    "outbox": "'pending', 'delivered', 'dead'",
}

# --- catalog statements --------------------------------------------------------
# Static text, parameters only; every statement reads pg_catalog. %s is the
# schema's oid (or name, for the lookup).

_Q_CONTEXT: Final[LiteralString] = """
SELECT current_user::text, current_database()::text, current_schema()::text,
       split_part(current_setting('server_version'), ' ', 1),
       current_setting('transaction_read_only'),
       r.rolsuper, r.rolbypassrls
FROM pg_roles r
WHERE r.rolname = current_user
"""

_Q_SCHEMA: Final[LiteralString] = """
SELECT n.oid, quote_ident(n.nspname) FROM pg_namespace n WHERE n.nspname = %s
"""

_Q_TABLES: Final[LiteralString] = """
SELECT c.oid, c.relname::text, quote_ident(c.relname), c.relrowsecurity, c.relforcerowsecurity,
       pg_get_userbyid(c.relowner)::text
FROM pg_class c
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""

# Domains are resolved to their base type; enum labels and domain CHECKs come
# along so a state column's value set can be read whichever way it is declared.
_Q_COLUMNS: Final[LiteralString] = """
SELECT a.attrelid, a.attname::text, quote_ident(a.attname), a.attnotnull,
       format_type(a.atttypid, a.atttypmod), coalesce(bt.typname, t.typname)::text,
       ARRAY(SELECT e.enumlabel::text FROM pg_enum e
             WHERE e.enumtypid = a.atttypid ORDER BY e.enumsortorder),
       ARRAY(SELECT pg_get_constraintdef(d.oid) FROM pg_constraint d
             WHERE d.contypid = a.atttypid AND d.contype = 'c' ORDER BY d.conname)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

_Q_CONSTRAINTS: Final[LiteralString] = """
SELECT con.conrelid, con.conname::text, quote_ident(con.conname), con.contype::text,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.conkey) WITH ORDINALITY AS k (num, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num
             ORDER BY k.ord),
       con.confrelid,
       CASE WHEN con.contype = 'f' THEN con.confrelid::regclass::text END,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.confkey) WITH ORDINALITY AS k (num, ord)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num
             ORDER BY k.ord),
       con.confdeltype::text, pg_get_constraintdef(con.oid)
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
WHERE c.relnamespace = %s AND con.contype IN ('p', 'u', 'f', 'c', 'x')
ORDER BY con.conrelid, con.conname
"""

# Key columns only (INCLUDE columns cannot make a row unique); '' marks an
# expression column.
_Q_INDEXES: Final[LiteralString] = """
SELECT x.indrelid, i.relname::text, x.indisunique, x.indisprimary,
       ARRAY(SELECT coalesce(a.attname::text, '')
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k (num, ord)
             LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.num
             WHERE k.ord <= x.indnkeyatts
             ORDER BY k.ord),
       pg_get_expr(x.indexprs, x.indrelid), pg_get_expr(x.indpred, x.indrelid),
       EXISTS (SELECT 1 FROM pg_constraint con
               WHERE con.conindid = x.indexrelid AND con.conrelid = x.indrelid
                 AND con.contype IN ('p', 'u', 'x')),
       x.indisvalid
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relnamespace = %s
ORDER BY x.indrelid, i.relname
"""

_Q_TRIGGERS: Final[LiteralString] = """
SELECT t.tgrelid, t.tgname::text, t.tgtype::int, t.tgenabled::text,
       ARRAY(SELECT a.attname::text FROM unnest(t.tgattr::int2[]) AS k (num)
             JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = k.num),
       p.proname::text, p.prosrc
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_proc p ON p.oid = t.tgfoid
WHERE c.relnamespace = %s AND NOT t.tgisinternal
ORDER BY t.tgrelid, t.tgname
"""

_Q_RULES: Final[LiteralString] = """
SELECT r.ev_class, r.rulename::text, r.ev_type::text, r.is_instead
FROM pg_rewrite r
JOIN pg_class c ON c.oid = r.ev_class
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND r.ev_enabled <> 'D'
ORDER BY r.ev_class, r.rulename
"""

# polroles holds 0 for PUBLIC.
_Q_POLICIES: Final[LiteralString] = """
SELECT p.polrelid, p.polname::text, p.polpermissive,
       ARRAY(SELECT CASE WHEN u.role_oid = 0 THEN 'public'
                         ELSE pg_get_userbyid(u.role_oid)::text END
             FROM unnest(p.polroles) AS u (role_oid) ORDER BY 1),
       pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid)
FROM pg_policy p
JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %s
ORDER BY p.polrelid, p.polname
"""

# Grants to anyone but the table's owner (grantee 0 is PUBLIC).
_Q_GRANTS: Final[LiteralString] = """
SELECT c.oid, CASE WHEN a.grantee = 0 THEN 'public' ELSE pg_get_userbyid(a.grantee)::text END,
       a.privilege_type
FROM pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) AS a
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner
ORDER BY 1, 2, 3
"""

# Roles named in a policy (except PUBLIC and the table's owner, whose
# owner-only policy exists because of FORCE ROW LEVEL SECURITY), and every
# role that inherits from them, that is a superuser or has BYPASSRLS: RLS
# does not apply to them, so a runtime or agent logging in as one is unscoped.
_Q_ELEVATED_MEMBERS: Final[LiteralString] = """
WITH RECURSIVE named (roleid) AS (
    SELECT DISTINCT u.role_oid
    FROM pg_policy p
    JOIN pg_class c ON c.oid = p.polrelid
    CROSS JOIN LATERAL unnest(p.polroles) AS u (role_oid)
    WHERE c.relnamespace = %s AND u.role_oid <> 0 AND u.role_oid <> c.relowner
), members (roleid, via) AS (
    SELECT roleid, roleid FROM named
    UNION
    SELECT m.member, members.via
    FROM pg_auth_members m JOIN members ON m.roleid = members.roleid
)
SELECT r.rolname::text, v.rolname::text, r.rolsuper, r.rolbypassrls
FROM members
JOIN pg_roles r ON r.oid = members.roleid
JOIN pg_roles v ON v.oid = members.via
WHERE r.rolsuper OR r.rolbypassrls
ORDER BY 1, 2
"""

_Q_ROUTINES: Final[LiteralString] = """
SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = %s ORDER BY 1
"""


class AuditError(AgentDBError):
    """The catalog could not be read (the server refused a catalog query)."""


# --- report ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """What the schema does about one guarantee.

    Attributes:
        guarantee: ``"G1"`` ... ``"G17"``.
        title: the guarantee in a few words.
        status: ``enforced``, ``partial``, ``missing`` or ``not_applicable``.
        reason: one line: what enforces it, or the first thing missing.
        evidence: the named objects (constraints, triggers, indexes, policies,
            columns, grants) the guarantee rests on, each prefixed by its kind.
        problems: every gap found, one line each (empty when enforced).
        fix: suggested SQL for the problems, ``None`` when there are none.
    """

    guarantee: str
    title: str
    status: Status
    reason: str
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class TableRef:
    """The table playing one role, and whether ``--map`` or the heuristics chose it."""

    name: str
    source: Literal["map", "heuristic"]


@dataclass(frozen=True, slots=True)
class Report:
    """The audit of one schema: one finding per guarantee, G1 to G17 in order."""

    database: str
    schema: str
    role: str
    server_version: str
    tenant_column: str
    tables: Mapping[str, TableRef | None]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    def finding(self, guarantee: str) -> Finding:
        """Return the finding for ``guarantee`` (``"G7"``).

        Raises:
            KeyError: no such guarantee.
        """
        for f in self.findings:
            if f.guarantee == guarantee:
                return f
        raise KeyError(guarantee)

    def statuses(self) -> dict[str, Status]:
        """Return ``{"G1": "enforced", ...}``."""
        return {f.guarantee: f.status for f in self.findings}

    def summary(self) -> dict[str, int]:
        """Return how many findings have each status (every status is a key)."""
        counts = Counter(f.status for f in self.findings)
        return {s: counts.get(s, 0) for s in STATUSES}

    def exit_code(self, fail_on: str | None = None) -> int:
        """Return the CLI exit status: :data:`EXIT_FINDINGS` if any finding is at or below
        ``fail_on`` (``"missing"``, or ``"partial"`` which also counts missing), else 0.

        Raises:
            ConfigurationError: ``fail_on`` is not ``None``, ``"missing"`` or ``"partial"``.
        """
        if fail_on is None:
            return 0
        if fail_on not in ("missing", "partial"):
            raise ConfigurationError(f"--fail-on must be 'missing' or 'partial', not {fail_on!r}")
        bad = {"missing"} if fail_on == "missing" else {"missing", "partial"}
        return EXIT_FINDINGS if any(f.status in bad for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain data; the shape is :data:`JSON_SCHEMA`."""
        return {
            "version": REPORT_VERSION,
            "database": self.database,
            "schema": self.schema,
            "role": self.role,
            "server_version": self.server_version,
            "tenant_column": self.tenant_column,
            "tables": {
                kind: (None if ref is None else {"name": ref.name, "source": ref.source})
                for kind, ref in self.tables.items()
            },
            "summary": self.summary(),
            "notes": list(self.notes),
            "findings": [
                {
                    "guarantee": f.guarantee,
                    "title": f.title,
                    "status": f.status,
                    "reason": f.reason,
                    "evidence": list(f.evidence),
                    "problems": list(f.problems),
                    "fix": f.fix,
                }
                for f in self.findings
            ],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """Return the report as JSON (see :data:`JSON_SCHEMA`)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def render(self, *, max_evidence: int = 6) -> str:
        """Return the human-readable table ``agentdb audit`` prints."""
        tables = "  ".join(
            f"{kind}={ref.name if ref else '-'}" for kind, ref in self.tables.items()
        )
        lines = [
            f"agentdb audit: database {self.database}, schema {self.schema}, "
            f"as {self.role} (PostgreSQL {self.server_version})",
            f"tables: {tables}  (tenant column {self.tenant_column})",
            *(f"note: {n}" for n in self.notes),
            "",
            f"{'ID':<4} {'STATUS':<15} GUARANTEE",
        ]
        pad = " " * 7
        for f in self.findings:
            lines.append(f"{f.guarantee:<4} {f.status:<15} {f.title}")
            if f.status == "enforced":
                lines.append(f"{pad}{f.reason}")
                shown = f.evidence[:max_evidence]
                more = len(f.evidence) - len(shown)
                if shown:
                    tail = f", ... (+{more} more)" if more > 0 else ""
                    lines.append(f"{pad}by: {', '.join(shown)}{tail}")
                continue
            if len(f.problems) > 1:
                lines.extend(f"{pad}- {p}" for p in f.problems)
            else:
                lines.append(f"{pad}{f.reason}")
            if f.fix:
                fix_lines = f.fix.splitlines()
                lines.append(f"{pad}fix: {fix_lines[0]}")
                lines.extend(f"{pad}     {line}" for line in fix_lines[1:])
        counts = self.summary()
        lines += [
            "",
            f"{len(self.findings)} guarantees: {counts['enforced']} enforced, "
            f"{counts['partial']} partial, {counts['missing']} missing, "
            f"{counts['not_applicable']} not applicable",
        ]
        return "\n".join(lines) + "\n"


#: JSON Schema (draft 2020-12) of :meth:`Report.to_json`; documented in the README.
JSON_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "agentdb audit report",
    "type": "object",
    "required": [
        "version",
        "database",
        "schema",
        "role",
        "server_version",
        "tenant_column",
        "tables",
        "summary",
        "notes",
        "findings",
    ],
    "additionalProperties": False,
    "properties": {
        "version": {"const": REPORT_VERSION},
        "database": {"type": "string"},
        "schema": {"type": "string"},
        "role": {"type": "string"},
        "server_version": {"type": "string"},
        "tenant_column": {"type": "string"},
        "tables": {
            "type": "object",
            "required": list(_KINDS),
            "additionalProperties": False,
            "properties": {kind: {"$ref": "#/$defs/table"} for kind in _KINDS},
        },
        "summary": {
            "type": "object",
            "required": list(STATUSES),
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        "findings": {
            "type": "array",
            "minItems": 17,
            "maxItems": 17,
            "items": {"$ref": "#/$defs/finding"},
        },
    },
    "$defs": {
        "table": {
            "type": ["object", "null"],
            "required": ["name", "source"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string"},
                "source": {"enum": ["map", "heuristic"]},
            },
        },
        "finding": {
            "type": "object",
            "required": ["guarantee", "title", "status", "reason", "evidence", "problems", "fix"],
            "additionalProperties": False,
            "properties": {
                "guarantee": {"type": "string", "pattern": "^G([1-9]|1[0-7])$"},
                "title": {"type": "string"},
                "status": {"enum": list(STATUSES)},
                "reason": {"type": "string"},
                "evidence": {"type": "array", "items": {"type": "string"}},
                "problems": {"type": "array", "items": {"type": "string"}},
                "fix": {"type": ["string", "null"]},
            },
        },
    },
}


# --- catalog snapshot -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    qname: str
    notnull: bool
    type: str
    base: str  # the type's name; a domain's base type
    enum_labels: tuple[str, ...]
    domain_checks: tuple[str, ...]

    @property
    def is_json(self) -> bool:
        return self.base in ("json", "jsonb")


@dataclass(frozen=True, slots=True)
class _Constraint:
    name: str
    qname: str
    type: str  # p u f c x
    columns: tuple[str, ...]
    ref_oid: int
    ref_display: str
    ref_columns: tuple[str, ...]
    on_delete: str  # a r c n d
    definition: str


@dataclass(frozen=True, slots=True)
class _Index:
    name: str
    unique: bool
    primary: bool
    columns: tuple[str, ...]  # key columns; '' for an expression
    expressions: str | None
    predicate: str | None
    backs_constraint: bool
    valid: bool


@dataclass(frozen=True, slots=True)
class _Trigger:
    name: str
    tgtype: int
    enabled: bool
    columns: tuple[str, ...]  # UPDATE OF columns; empty for any column
    function: str
    source: str

    # pg_trigger.tgtype bits (include/catalog/pg_trigger.h).
    @property
    def row(self) -> bool:
        return bool(self.tgtype & 1)

    @property
    def before(self) -> bool:
        return bool(self.tgtype & 2)

    @property
    def on_insert(self) -> bool:
        return bool(self.tgtype & 4)

    @property
    def on_delete(self) -> bool:
        return bool(self.tgtype & 8)

    @property
    def on_update(self) -> bool:
        return bool(self.tgtype & 16)

    @property
    def on_truncate(self) -> bool:
        return bool(self.tgtype & 32)

    def raises(self) -> bool:
        return _RAISES.search(self.source) is not None

    def reads_old(self, column: str) -> bool:
        pattern = rf"\bOLD\s*\.\s*(?:{re.escape(column)}|\"{re.escape(column)}\")(?!\w)"
        return re.search(pattern, self.source, re.IGNORECASE) is not None

    def mentions(self, name: str) -> bool:
        return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", self.source, re.IGNORECASE) is not None


_RAISES = re.compile(r"\bRAISE\b(?!\s+(?:NOTICE|WARNING|INFO|LOG|DEBUG)\b)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Policy:
    name: str
    permissive: bool
    roles: tuple[str, ...]
    qual: str | None
    with_check: str | None


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    event: str  # 1 select, 2 update, 3 insert, 4 delete
    instead: bool


@dataclass(slots=True)
class _Table:
    oid: int
    name: str
    display: str
    owner: str
    rls: bool
    force_rls: bool
    columns: dict[str, _Column] = field(default_factory=dict)
    constraints: list[_Constraint] = field(default_factory=list)
    indexes: list[_Index] = field(default_factory=list)
    triggers: list[_Trigger] = field(default_factory=list)
    policies: list[_Policy] = field(default_factory=list)
    rules: list[_Rule] = field(default_factory=list)
    grants: list[tuple[str, str]] = field(default_factory=list)  # (grantee, privilege)

    def col(self, *names: str) -> _Column | None:
        for n in names:
            if n in self.columns:
                return self.columns[n]
        return None

    def q(self, column: str) -> str:
        c = self.columns.get(column)
        return c.qname if c is not None else _quote(column)

    def of(self, kind: str) -> list[_Constraint]:
        return [c for c in self.constraints if c.type == kind]

    @property
    def pk(self) -> _Constraint | None:
        return next(iter(self.of("p")), None)

    def checks_on(self, column: str) -> list[_Constraint]:
        return [c for c in self.of("c") if column in c.columns]

    def live_triggers(self) -> list[_Trigger]:
        return [t for t in self.triggers if t.enabled]

    def unique_keys(self) -> list[tuple[str, tuple[str, ...], str | None]]:
        """(name, key columns, partial predicate) of every UNIQUE constraint or index."""
        keys: list[tuple[str, tuple[str, ...], str | None]]
        keys = [(c.name, c.columns, None) for c in self.of("u")]
        keys += [
            (i.name, i.columns, i.predicate)
            for i in self.indexes
            if i.unique and not i.primary and not i.backs_constraint and i.valid
        ]
        return keys


@dataclass(slots=True)
class _Catalog:
    database: str
    schema: str
    role: str
    role_super: bool
    role_bypassrls: bool
    server_version: str
    tables: dict[str, _Table]
    elevated: list[tuple[str, str, bool, bool]]  # (member, via policy role, super, bypassrls)
    routines: list[str]

    def by_oid(self, oid: int) -> _Table | None:
        for t in self.tables.values():
            if t.oid == oid:
                return t
        return None


_SIMPLE_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def _quote(name: str) -> str:
    """Quote an identifier for a suggested fix, the way quote_ident() would (keywords aside)."""
    name = name[:63]
    return name if _SIMPLE_IDENT.match(name) else '"' + name.replace('"', '""') + '"'


@contextmanager
def _read_only(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Yield a connection inside a READ ONLY transaction, rolled back at the end."""
    try:
        conn = psycopg.connect(libpq_dsn(dsn), connect_timeout=10)
    except psycopg.OperationalError as exc:
        # libpq's first line names the failure; later lines are indented hints.
        text = str(exc).strip()
        reason = text.splitlines()[0].strip() if text else type(exc).__name__
        raise DatabaseUnavailable(f"cannot connect to {redact(dsn)}: {reason}") from exc
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"cannot use {redact(dsn)}: {exc}") from exc
    try:
        # Every transaction psycopg opens on this connection is BEGIN READ ONLY:
        # the audit cannot write even by mistake.
        conn.read_only = True
        yield conn
    except psycopg.Error as exc:
        raise _translate(exc, dsn) from exc
    finally:
        # A failed rollback means the connection is gone; the error above says why.
        with suppress(psycopg.Error):
            conn.rollback()
        conn.close()


def _translate(exc: psycopg.Error, dsn: str) -> AgentDBError:
    """Map a catalog query failure on its SQLSTATE, never its message text."""
    state = exc.sqlstate or ""
    primary = exc.diag.message_primary or type(exc).__name__
    if not state or state.startswith("08") or state in ("57P01", "57P02", "57P03"):
        return DatabaseUnavailable(f"lost the connection to {redact(dsn)}: {primary}")
    if state == "42501":
        return AuditError(f"this role may not read the catalog (SQLSTATE 42501): {primary}")
    return AuditError(f"reading the catalog failed (SQLSTATE {state}): {primary}")


def _rows(
    conn: psycopg.Connection[Any], query: LiteralString, *params: Any
) -> list[tuple[Any, ...]]:
    return conn.execute(query, params).fetchall()


def _snapshot(conn: psycopg.Connection[Any], schema: str | None) -> _Catalog:
    ctx = _rows(conn, _Q_CONTEXT)
    if not ctx:
        raise AuditError("the connecting role is not in pg_roles")
    role, database, current, version, read_only, rolsuper, bypass = ctx[0]
    if read_only != "on":
        raise AuditError("the audit transaction is not read-only; refusing to continue")
    target = schema if schema is not None else current
    if target is None:
        raise ConfigurationError(
            "no schema on the search_path exists in this database; pass --schema"
        )
    found = _rows(conn, _Q_SCHEMA, target)
    if not found:
        raise ConfigurationError(f"schema {target!r} does not exist in database {database!r}")
    nsp, qschema = found[0]
    prefix = "" if target == current else f"{qschema}."

    tables: dict[int, _Table] = {}
    for oid, rel, qrel, rls, force, owner in _rows(conn, _Q_TABLES, nsp):
        tables[oid] = _Table(oid, rel, prefix + qrel, owner, rls, force)
    for rel_oid, col, qcol, notnull, typ, base, labels, checks in _rows(conn, _Q_COLUMNS, nsp):
        tables[rel_oid].columns[col] = _Column(
            col, qcol, notnull, typ, base, tuple(labels), tuple(checks)
        )
    for rel_oid, *con in _rows(conn, _Q_CONSTRAINTS, nsp):
        name, qname, kind, cols, ref_oid, ref_display, ref_cols, on_delete, definition = con
        constraint = _Constraint(
            name, qname, kind, tuple(cols), ref_oid or 0, ref_display or "", tuple(ref_cols),
            on_delete, definition,
        )  # fmt: skip
        tables[rel_oid].constraints.append(constraint)
    for rel_oid, *idx in _rows(conn, _Q_INDEXES, nsp):
        name, unique, primary, cols, exprs, pred, backs, valid = idx
        if rel_oid in tables:  # indexes of partitions and the like
            tables[rel_oid].indexes.append(
                _Index(name, unique, primary, tuple(cols), exprs, pred, backs, valid)
            )
    for rel_oid, name, tgtype, enabled, cols, function, source in _rows(conn, _Q_TRIGGERS, nsp):
        if rel_oid in tables:
            # 'O' fires in normal sessions, 'A' always; 'D' is disabled and 'R'
            # fires only on replicas - neither protects anything here.
            tables[rel_oid].triggers.append(
                _Trigger(name, tgtype, enabled in ("O", "A"), tuple(cols), function, source or "")
            )
    for rel_oid, name, event, instead in _rows(conn, _Q_RULES, nsp):
        tables[rel_oid].rules.append(_Rule(name, event, instead))
    for rel_oid, name, permissive, roles, qual, check in _rows(conn, _Q_POLICIES, nsp):
        if rel_oid in tables:
            tables[rel_oid].policies.append(_Policy(name, permissive, tuple(roles), qual, check))
    for rel_oid, grantee, privilege in _rows(conn, _Q_GRANTS, nsp):
        tables[rel_oid].grants.append((grantee, privilege))
    elevated = [(r[0], r[1], r[2], r[3]) for r in _rows(conn, _Q_ELEVATED_MEMBERS, nsp)]
    routines = [r[0] for r in _rows(conn, _Q_ROUTINES, nsp)]
    return _Catalog(
        database=database,
        schema=target,
        role=role,
        role_super=rolsuper,
        role_bypassrls=bypass,
        server_version=version,
        tables={t.name: t for t in tables.values()},
        elevated=elevated,
        routines=routines,
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
            if key not in MAP_KEYS:
                raise ConfigurationError(f"--map key {key!r} is unknown; use {', '.join(MAP_KEYS)}")
            if key in mapping:
                raise ConfigurationError(f"--map names {key!r} twice")
            mapping[key] = value
    return mapping


def _check_mapping(cat: _Catalog, mapping: Mapping[str, str]) -> None:
    for key, value in mapping.items():
        if key not in MAP_KEYS:
            raise ConfigurationError(f"--map key {key!r} is unknown; use {', '.join(MAP_KEYS)}")
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


# --- the audit ----------------------------------------------------------------------


def audit(
    dsn: str, *, schema: str | None = None, mapping: Mapping[str, str] | None = None
) -> Report:
    """Audit one schema of the database at ``dsn`` against G1-G17.

    ``schema`` defaults to the first schema on the connecting role's
    search_path. ``mapping`` assigns tables to roles (keys :data:`MAP_KEYS`;
    a value of ``"-"`` says there is no such table), overriding the
    heuristics. Only pg_catalog is read, in a READ ONLY transaction.

    Raises:
        ConfigurationError: no or malformed DSN, unknown schema, or a mapping
            naming an unknown key, a missing table or a missing column.
        DatabaseUnavailable: the server cannot be reached, refuses the login or
            drops the connection.
        AuditError: the server refused a catalog query.
    """
    given = dict(mapping or {})
    with _read_only(dsn) as conn:
        cat = _snapshot(conn, schema)
    _check_mapping(cat, given)
    return _Auditor(cat, given).run()


class _Findings:
    """Collects evidence, problems and fixes for one guarantee."""

    def __init__(self) -> None:
        self.evidence: list[str] = []
        self.problems: list[str] = []
        self.fixes: list[str] = []

    def ok(self, *evidence: str) -> None:
        for e in evidence:
            if e not in self.evidence:
                self.evidence.append(e)

    def bad(self, problem: str, fix: str | None = None) -> None:
        self.problems.append(problem)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)

    def finding(self, gid: str, *, core_missing: bool, enforced: str) -> Finding:
        """No problems: enforced (``enforced`` is the reason). Otherwise missing when
        ``core_missing`` says the heart of the guarantee is absent, else partial."""
        if not self.problems:
            return Finding(gid, _TITLES[gid], "enforced", enforced, self.evidence)
        status: Status = "missing" if core_missing else "partial"
        first = self.problems[0]
        more = len(self.problems) - 1
        reason = first if not more else f"{first} (+{more} more)"
        return Finding(
            gid,
            _TITLES[gid],
            status,
            reason,
            self.evidence,
            self.problems,
            "\n".join(self.fixes) or None,
        )


def _value_set(table: _Table, column: _Column) -> tuple[bool, frozenset[str] | None]:
    """Is the column's value set declared, and what is it (None if not a list)?

    Counts an enum type, a domain with a CHECK, a CHECK that compares the
    column with a list (``IN``/``= ANY``) or a pattern, and a foreign key on it.
    """
    if column.enum_labels:
        return True, frozenset(column.enum_labels)
    for definition in column.domain_checks:
        values = _listed(definition, "VALUE")
        if values is not None:
            return True, values
    if column.domain_checks:
        return True, None
    for con in table.checks_on(column.name):
        values = _listed(con.definition, column.qname)
        if values is not None:
            return True, values
        if con.columns == (column.name,) and re.search(
            rf"(?<![\w\"]){re.escape(column.qname)}\)?(::[\w ]+)?\)? ~", con.definition
        ):
            return True, None
    if any(column.name in fk.columns for fk in table.of("f")):
        return True, None
    return False, None


def _listed(definition: str, qcol: str) -> frozenset[str] | None:
    # pg_get_constraintdef prints `col IN (...)` as `(col = ANY (ARRAY['a'::text, ...]))`.
    pattern = (
        rf"(?<![\w\"])\(*{re.escape(qcol)}\)*(?:::[\w ]+)?\s*=\s*ANY\s*"
        r"\(+ARRAY\[(?P<items>[^\]]*)\]"
    )
    m = re.search(pattern, definition)
    if m is None:
        return None
    return frozenset(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", m["items"]))


def _finds_unknown(index: _Index, state: _Column) -> bool:
    """Does the index find operations in doubt? Led by the state column, or partial
    on a predicate that selects an unknown-like state (a retention index over
    settled rows does not count)."""
    if index.columns and index.columns[0] == state.name:
        return True
    pred = index.predicate or ""
    if not re.search(rf"(?<![\w\"]){re.escape(state.qname)}(?![\w\"])", pred):
        return False
    named = {v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", pred)}
    if "<>" in pred or re.search(r"\bNOT\b", pred):
        return not named & _UNKNOWN_STATES  # e.g. state <> ALL ('succeeded', 'failed')
    return bool(named & _UNKNOWN_STATES)


_JSON_PATH = re.compile(
    r"->>?|#>>?|@\?|\bjsonb?_path_\w+\s*\(|\bjsonb?_extract_path(?:_text)?\s*\(",
    re.IGNORECASE,
)
_JSON_OPERATOR = re.compile(r"@>|<@|\?\||\?&|\s\?\s")


def _json_path_use(expression: str | None, table: _Table) -> bool:
    """Does the expression read a fact out of a JSON document?"""
    if not expression:
        return False
    if _JSON_PATH.search(expression):
        return True
    # @>, ? and friends also work on arrays and ranges: count them only when
    # the expression names one of the table's JSON columns.
    if _JSON_OPERATOR.search(expression):
        return any(
            re.search(rf"(?<![\w\"]){re.escape(c.qname)}(?![\w\"])", expression)
            for c in table.columns.values()
            if c.is_json
        )
    return False


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _cols(columns: Sequence[str]) -> str:
    return ", ".join(columns)


class _Auditor:
    def __init__(self, cat: _Catalog, mapping: Mapping[str, str]) -> None:
        self.cat = cat
        self.mapping = mapping
        self.tc = mapping.get("tenant", "tenant_id")
        self.notes: list[str] = []
        self.kinds: dict[str, _Table | None] = {}
        self.refs: dict[str, TableRef | None] = {}
        self._detect()
        self.tenants_oid = self._tenants_oid()
        self.owned = [t for t in cat.tables.values() if self._tenant_owned(t)]

    # -- roles of tables -----------------------------------------------------------

    def _detect(self) -> None:
        taken = {v for k, v in self.mapping.items() if k != "tenant" and v != _NONE}
        for kind in _KINDS:
            if kind in self.mapping:
                value = self.mapping[kind]
                table = None if value == _NONE else self.cat.tables[value]
                self.kinds[kind] = table
                self.refs[kind] = None if table is None else TableRef(table.name, "map")
                continue
            if kind == "tenants":
                continue  # found from the tenant column's foreign keys, below
            scored = [
                (score, t.name)
                for t in self.cat.tables.values()
                if t.name not in taken and (score := self._score(kind, t)) > 0
            ]
            scored.sort(key=lambda s: (-s[0], s[1]))
            if not scored:
                self.kinds[kind], self.refs[kind] = None, None
                continue
            best = self.cat.tables[scored[0][1]]
            if len(scored) > 1 and scored[1][0] == scored[0][0]:
                others = ", ".join(n for s, n in scored[1:] if s == scored[0][0])
                self.notes.append(
                    f"{kind}: {best.name} chosen over {others} (equal heuristic score); "
                    f"--map {kind}=TABLE picks another"
                )
            taken.add(best.name)
            self.kinds[kind], self.refs[kind] = best, TableRef(best.name, "heuristic")
        if "tenants" not in self.mapping:
            self.kinds["tenants"], self.refs["tenants"] = None, None
        self.refs = {k: self.refs.get(k) for k in _KINDS}

    def _score(self, kind: str, t: _Table) -> int:
        name = t.name.lower()
        if kind == "tasks":
            named = _TASK_NAME.search(name) is not None
            shaped = t.col(*_STATE) is not None and (
                t.col(*_WAKE, *_VERSION, *_LEASE_OWNER, *_LEASE_EXPIRES) is not None
            )
            # A table holding idempotency keys is an operation unless its name says task/job.
            if not (named or shaped) or (not named and t.col(*_OP_KEY) is not None):
                return 0
            return (
                4 * named
                + (t.col(*_STATE) is not None)
                + (t.col(*_WAKE) is not None)
                + (t.col(*_VERSION) is not None)
                + (t.col(*_LEASE_OWNER, *_LEASE_EXPIRES) is not None)
            )
        if kind == "operations":
            if t.col(*_OP_KEY) is None:
                return 0
            tasks = self.kinds.get("tasks")
            links = tasks is not None and any(fk.ref_oid == tasks.oid for fk in t.of("f"))
            return 3 + 2 * bool(_OP_NAME.search(name)) + links + (t.col(*_HASH) is not None)
        if kind == "events":
            if _EVENT_NAME.search(name) is None or t.col(*_EVENT_MARK) is None:
                return 0
            return 1 + sum(c in t.columns for c in _EVENT_MARK) + ("payload" in t.columns)
        if kind == "outbox":
            if "outbox" in name:
                return 3
            return 2 if t.col(*_TOPIC) and t.col(*_DELIVERED) else 0
        if kind == "inbox":
            if "inbox" in name:
                return 3
            return 2 if t.col(*_MESSAGE_ID) and t.col(*_CONSUMER) else 0
        if kind == "credentials":
            return 1 if _CREDENTIAL_NAME.search(name) else 0
        return 0

    def _tenants_oid(self) -> int | None:
        mapped = self.kinds.get("tenants")
        if mapped is not None:
            return mapped.oid
        if "tenants" in self.mapping:
            return None
        targets = Counter(
            fk.ref_oid
            for t in self.cat.tables.values()
            for fk in t.of("f")
            if fk.columns == (self.tc,)
        )
        if not targets:
            return None
        oid = targets.most_common(1)[0][0]
        table = self.cat.by_oid(oid)
        if table is not None:
            self.kinds["tenants"] = table
            self.refs["tenants"] = TableRef(table.name, "heuristic")
        else:
            self.notes.append(f"tenants: {self._tenants_display(oid)} (outside this schema)")
        return oid

    def _tenant_owned(self, t: _Table) -> bool:
        if self.tc not in t.columns or t.oid == self.tenants_oid:
            return False
        # The tenants table is the anchor, not tenant data: a table whose only
        # link is a foreign key to it (a role -> tenant lookup) is not owned.
        kind_oids = {k.oid for kind, k in self.kinds.items() if k is not None and kind != "tenants"}
        if t.oid in kind_oids or t.rls:
            return True
        if any(self.tc in cols for _, cols, _ in t.unique_keys()) or (
            t.pk is not None and self.tc in t.pk.columns
        ):
            return True
        for fk in t.of("f"):
            if fk.ref_oid in kind_oids or (self.tc in fk.columns and len(fk.columns) > 1):
                return True
        return any(
            fk.ref_oid == t.oid
            for kind, k in self.kinds.items()
            if k is not None and kind != "tenants"
            for fk in k.of("f")
        )

    @property
    def tasks(self) -> _Table | None:
        return self.kinds["tasks"]

    @property
    def ops(self) -> _Table | None:
        return self.kinds["operations"]

    @property
    def events(self) -> _Table | None:
        return self.kinds["events"]

    @property
    def outbox(self) -> _Table | None:
        return self.kinds["outbox"]

    def _stateful(self) -> list[tuple[str, _Table]]:
        return [
            (kind, t)
            for kind in ("tasks", "operations", "outbox")
            if (t := self.kinds[kind]) is not None
        ]

    def run(self) -> Report:
        # One method per guarantee, named after it.
        checks: list[Callable[[], Finding]] = [getattr(self, f"g{n}") for n in range(1, 18)]
        return Report(
            database=self.cat.database,
            schema=self.cat.schema,
            role=self.cat.role,
            server_version=self.cat.server_version,
            tenant_column=self.tc,
            tables=self.refs,
            findings=[check() for check in checks],
            notes=self.notes,
        )

    # -- G1 ----------------------------------------------------------------------

    def g1(self) -> Finding:
        f = _Findings()
        tc = _quote(self.tc)
        tasks, ops = self.tasks, self.ops
        if tasks is None:
            f.bad(
                "no task-like table (a state column with wake_at/state_version/lease "
                "columns, or task/job in the name); --map tasks=TABLE names it",
                "-- agentdb sql prints a complete agent_tasks table to start from",
            )
            return f.finding("G1", core_missing=True, enforced="")
        if ops is None:
            f.bad(
                f"no operation table apart from {tasks.name} (a table with an "
                "idempotency_key column): effects are not recorded separately from tasks",
                f"CREATE TABLE operations ({tc} uuid NOT NULL, id uuid NOT NULL, "
                f"task_id uuid NOT NULL, idempotency_key text NOT NULL, input_hash text NOT NULL, "
                f"state text NOT NULL, PRIMARY KEY ({tc}, id), "
                f"FOREIGN KEY ({tc}, task_id) REFERENCES {tasks.display} ({tc}, id));",
            )
            return f.finding("G1", core_missing=True, enforced="")
        f.ok(f"table {tasks.name}", f"table {ops.name}")
        links = [fk for fk in ops.of("f") if fk.ref_oid == tasks.oid]
        if links:
            f.ok(*(f"fk {fk.name}" for fk in links))
        else:
            ref = ops.col(*_TASK_REF)
            cols = f"{self.tc}, {ref.name}" if ref else f"{self.tc}, task_id"
            f.bad(
                f"{ops.name} has no foreign key to {tasks.name}: an operation need not "
                "belong to a task",
                f"ALTER TABLE {ops.display} ADD CONSTRAINT {_quote(ops.name + '_task_fkey')} "
                f"FOREIGN KEY ({cols}) REFERENCES {tasks.display} ({self.tc}, id);",
            )
        wake = tasks.col(*_WAKE)
        if wake is not None:
            f.ok(f"column {tasks.name}.{wake.name}")
        else:
            f.bad(
                f"{tasks.name} has no wake-up column (wake_at, run_at...): a task cannot "
                "wait between operations",
                f"ALTER TABLE {tasks.display} ADD COLUMN wake_at timestamptz;",
            )
        return f.finding(
            "G1",
            core_missing=False,
            enforced=f"{ops.name} rows belong to {tasks.name} rows"
            + (f" ({links[0].name})" if links else "")
            + (f"; {tasks.name}.{wake.name} schedules waits" if wake else ""),
        )

    # -- G2 ----------------------------------------------------------------------

    def g2(self) -> Finding:
        f = _Findings()
        tc = self.tc
        for kind in ("tasks", "operations", "events", "outbox", "inbox"):
            t = self.kinds[kind]
            if t is not None and tc not in t.columns:
                f.bad(
                    f"{t.name} has no {tc} column: its rows belong to no tenant",
                    f"ALTER TABLE {t.display} ADD COLUMN {_quote(tc)} uuid NOT NULL;",
                )
        if not self.owned:
            f.bad(f"no table has a tenant column {tc} (--map tenant=COLUMN names another)")
            return f.finding("G2", core_missing=True, enforced="")
        owned_oids = {t.oid for t in self.owned}
        good_fks = bad_fks = 0
        for t in self.owned:
            pk = t.pk
            if pk is None:
                # bigserial, not an identity column: Citus cannot reshard those.
                add_id = "" if "id" in t.columns else "ADD COLUMN id bigserial, "
                f.bad(
                    f"{t.name} has no primary key: its rows cannot be referenced per tenant",
                    f"ALTER TABLE {t.display} {add_id}ADD CONSTRAINT {_quote(t.name + '_pkey')} "
                    f"PRIMARY KEY ({t.q(tc)}, id);",
                )
            elif tc not in pk.columns:
                f.bad(
                    f"{pk.name} is PRIMARY KEY ({_cols(pk.columns)}): {tc} is not in it",
                    f"ALTER TABLE {t.display} DROP CONSTRAINT {pk.qname}, ADD CONSTRAINT "
                    f"{pk.qname} PRIMARY KEY ({t.q(tc)}, {_cols([t.q(c) for c in pk.columns])});"
                    " -- recreate the foreign keys that reference it",
                )
            else:
                f.ok(f"pk {pk.name}")
            for fk in t.of("f"):
                if fk.ref_oid == self.tenants_oid and fk.columns == (tc,):
                    f.ok(f"fk {fk.name}")
                    continue
                if fk.ref_oid not in owned_oids:
                    continue
                pairs = dict(zip(fk.columns, fk.ref_columns, strict=False))
                if pairs.get(tc) == tc:
                    good_fks += 1
                    f.ok(f"fk {fk.name}")
                    continue
                bad_fks += 1
                parent = self.cat.by_oid(fk.ref_oid)
                assert parent is not None
                f.bad(
                    f"{fk.name} ({_cols(fk.columns)}) -> {parent.name} "
                    f"({_cols(fk.ref_columns)}) lets a {t.name} row point at another "
                    "tenant's row",
                    f"ALTER TABLE {t.display} DROP CONSTRAINT {fk.qname}, ADD CONSTRAINT "
                    f"{fk.qname} FOREIGN KEY ({t.q(tc)}, {_cols([t.q(c) for c in fk.columns])}) "
                    f"REFERENCES {parent.display} ({parent.q(tc)}, "
                    f"{_cols([parent.q(c) for c in fk.ref_columns])});"
                    + self._unique_hint(parent, fk.ref_columns),
                )
            for names, target in ((_TASK_REF, self.tasks), (_OP_REF, self.ops)):
                ref = t.col(*names)
                if ref is None or target is None or target.oid == t.oid:
                    continue
                if not any(ref.name in fk.columns for fk in t.of("f")):
                    f.bad(
                        f"{t.name}.{ref.name} has no foreign key: it can name another "
                        f"tenant's {target.name} row, or none",
                        f"ALTER TABLE {t.display} ADD CONSTRAINT "
                        f"{_quote(t.name + '_' + ref.name.removesuffix('_id') + '_fkey')} "
                        f"FOREIGN KEY ({t.q(tc)}, {ref.qname}) REFERENCES {target.display} "
                        f"({target.q(tc)}, id);",
                    )
        core = (self.tasks is not None and tc not in self.tasks.columns) or (
            bad_fks > 0 and good_fks == 0
        )
        return f.finding(
            "G2",
            core_missing=core,
            enforced=f"every key and foreign key of {len(self.owned)} tenant-owned tables "
            f"carries {tc}",
        )

    def _unique_hint(self, parent: _Table, ref_columns: Sequence[str]) -> str:
        wanted = {self.tc, *ref_columns}
        keys = [set(cols) for _, cols, _ in parent.unique_keys()]
        if parent.pk is not None:
            keys.append(set(parent.pk.columns))
        if wanted in keys:
            return ""
        return (
            f"\nALTER TABLE {parent.display} ADD CONSTRAINT "
            f"{_quote(parent.name + '_' + self.tc + '_key')} UNIQUE ({parent.q(self.tc)}, "
            f"{_cols([parent.q(c) for c in ref_columns])});"
        )

    # -- G3 ----------------------------------------------------------------------

    def g3(self) -> Finding:
        f = _Findings()
        ops, tc = self.ops, self.tc
        if ops is None:
            f.bad("no operation table with an idempotency key (see G1)")
            return f.finding("G3", core_missing=True, enforced="")
        key = ops.col(*_OP_KEY)
        assert key is not None  # an operation table is found by its key column
        core = not self._key_is_unique(f, ops, key)
        judged = {(ops.oid, key.name)}
        tasks = self.tasks
        if tasks is not None and (dedupe := tasks.col(*_TASK_KEY)) is not None:
            self._key_is_unique(f, tasks, dedupe)
            judged.add((tasks.oid, dedupe.name))
        # Every other unique key of a tenant-owned table must be per tenant too
        # (primary keys are G2's: they are what foreign keys point at).
        for t in self.owned:
            for name, cols, _ in t.unique_keys():
                if tc in cols or any((t.oid, c) in judged for c in cols):
                    continue
                f.bad(
                    f"UNIQUE {name} ({_cols(cols)}) on {t.name} spans tenants: one tenant's "
                    "row blocks another's",
                    f"-- drop {name}, then\nALTER TABLE {t.display} ADD CONSTRAINT "
                    f"{_quote(name)} UNIQUE ({t.q(tc)}, {_cols([t.q(c) for c in cols if c])});",
                )
        return f.finding(
            "G3",
            core_missing=core,
            enforced=f"UNIQUE ({tc}, {key.name}) on {ops.name}",
        )

    def _key_is_unique(self, f: _Findings, t: _Table, key: _Column) -> bool:
        """Record whether ``key`` is unique per tenant; return False if it is not unique at all."""
        tc = self.tc
        keys = [(n, cols, pred) for n, cols, pred in t.unique_keys() if key.name in cols]
        exact = [k for k in keys if set(k[1]) == {tc, key.name}]
        if exact:
            name, _, pred = exact[0]
            f.ok(f"unique {name}" + (f" (partial: WHERE {pred})" if pred else ""))
            return True
        fix = (
            f"ALTER TABLE {t.display} ADD CONSTRAINT {_quote(t.name + '_' + key.name)} "
            f"UNIQUE ({t.q(tc)}, {key.qname});"
        )
        if not keys:
            f.bad(f"nothing makes {t.name}.{key.name} unique: two workers can both create it", fix)
            return False
        name, cols, _ = keys[0]
        if tc not in cols:
            f.bad(
                f"UNIQUE {name} ({_cols(cols)}) on {t.name} spans tenants: one tenant's "
                f"{key.name} blocks (and may be answered with) another's",
                f"-- drop {name}, then\n{fix}",
            )
        else:
            f.bad(
                f"UNIQUE {name} ({_cols(cols)}) on {t.name} allows the same {key.name} twice "
                "in a tenant",
                f"-- drop {name}, then\n{fix}",
            )
        return True

    # -- G4 ----------------------------------------------------------------------

    def g4(self) -> Finding:
        f = _Findings()
        ops = self.ops
        if ops is None:
            f.bad("no operation table with an idempotency key (see G1)")
            return f.finding("G4", core_missing=True, enforced="")
        key = ops.col(*_OP_KEY)
        assert key is not None
        core = not self._hash_checks(f, ops, key)
        tasks = self.tasks
        if tasks is not None and (dedupe := tasks.col(*_TASK_KEY)) is not None:
            self._hash_checks(f, tasks, dedupe)
        hash_col = ops.col(*_HASH)
        return f.finding(
            "G4",
            core_missing=core,
            enforced=f"{ops.name}.{hash_col.name if hash_col else ''} is required and "
            "format-checked; the runtime compares it under the row lock before answering",
        )

    def _hash_checks(self, f: _Findings, t: _Table, key: _Column) -> bool:
        h = t.col(*_HASH)
        if h is None:
            f.bad(
                f"{t.name} stores no input hash beside {key.name}: a reused key with "
                "different parameters gets the old result",
                f"ALTER TABLE {t.display} ADD COLUMN input_hash text NOT NULL; "
                "-- sha256 of the canonical input, compared before a stored result is returned",
            )
            return False
        f.ok(f"column {t.name}.{h.name}")
        ties = [c for c in t.of("c") if key.name in c.columns and h.name in c.columns]
        if ties:
            f.ok(*(f"check {c.name}" for c in ties))
        elif not h.notnull:
            f.bad(
                f"{t.name}.{h.name} may be NULL while {key.name} is set",
                f"ALTER TABLE {t.display} ADD CONSTRAINT {_quote(t.name + '_key_has_hash')} "
                f"CHECK (({key.qname} IS NULL) = ({h.qname} IS NULL));",
            )
        formats = [
            c
            for c in t.checks_on(h.name)
            if c.columns == (h.name,) and re.search(r" ~ |length\(|SIMILAR|LIKE", c.definition)
        ]
        if formats:
            f.ok(*(f"check {c.name}" for c in formats))
        else:
            f.bad(
                f"{t.name}.{h.name} has no format CHECK: any text (even '') passes as a hash",
                f"ALTER TABLE {t.display} ADD CONSTRAINT "
                f"{_quote(t.name + '_' + h.name + '_format')} "
                f"CHECK ({h.qname} ~ '^[0-9a-f]{{64}}$');",
            )
        return True

    # -- G5 ----------------------------------------------------------------------

    def g5(self) -> Finding:
        f = _Findings()
        constrained = 0
        stateful = self._stateful()
        for kind, t in stateful:
            state = t.col(*_STATE)
            if state is None:
                if kind != "outbox":
                    f.bad(
                        f"{t.name} has no state column",
                        f"ALTER TABLE {t.display} ADD COLUMN state text NOT NULL "
                        f"CONSTRAINT {_quote(t.name + '_state_valid')} "
                        f"CHECK (state IN ({_STATE_SETS[kind]}));",
                    )
                continue
            declared, _ = _value_set(t, state)
            if declared:
                constrained += 1
                f.ok(*self._state_evidence(t, state))
            else:
                f.bad(
                    f"{t.name}.{state.name} accepts any value: no CHECK, enum or foreign key",
                    f"ALTER TABLE {t.display} ADD CONSTRAINT "
                    f"{_quote(t.name + '_' + state.name + '_valid')} CHECK ({state.qname} IN "
                    f"({_STATE_SETS[kind]})); -- your states",
                )
            if not state.notnull:
                f.bad(
                    f"{t.name}.{state.name} may be NULL",
                    f"ALTER TABLE {t.display} ALTER COLUMN {state.qname} SET NOT NULL;",
                )
        for t in self.owned:
            c = t.columns[self.tc]
            if not c.notnull:
                f.bad(
                    f"{t.name}.{c.name} may be NULL: a row without an owner",
                    f"ALTER TABLE {t.display} ALTER COLUMN {c.qname} SET NOT NULL;",
                )
        if not stateful:
            f.bad("no task, operation or outbox table to check (see G1, G10)")
        return f.finding(
            "G5",
            core_missing=constrained == 0,
            enforced="every state column has a declared value set; owner columns are NOT NULL",
        )

    def _state_evidence(self, t: _Table, state: _Column) -> list[str]:
        if state.enum_labels:
            return [f"enum {t.name}.{state.name} ({state.type})"]
        if state.domain_checks:
            return [f"domain {t.name}.{state.name} ({state.type})"]
        names = [
            c.name
            for c in t.checks_on(state.name)
            if _listed(c.definition, state.qname) is not None
        ]
        return [f"check {n}" for n in names] or [f"fk on {t.name}.{state.name}"]

    # -- G6 ----------------------------------------------------------------------

    def g6(self) -> Finding:
        f = _Findings()
        guarded = 0
        stateful = [(k, t) for k, t in self._stateful() if t.col(*_STATE) is not None]
        for kind, t in stateful:
            state = t.col(*_STATE)
            assert state is not None
            guards = [
                g
                for g in t.live_triggers()
                if g.row
                and g.before
                and g.on_update
                and (not g.columns or state.name in g.columns)
                and g.reads_old(state.name)
                and g.raises()
            ]
            if guards:
                guarded += 1
                f.ok(*(f"trigger {g.name}" for g in guards))
            else:
                f.bad(
                    f"no trigger guards {t.name}.{state.name}: any UPDATE may move it "
                    "anywhere (e.g. succeeded -> pending)",
                    f"CREATE TRIGGER {_quote(t.name + '_transition_guard')} BEFORE INSERT OR "
                    f"UPDATE OF {state.qname} ON {t.display} FOR EACH ROW EXECUTE FUNCTION "
                    f"guard_transition('{kind}'); -- RAISE unless (OLD.{state.name}, "
                    f"NEW.{state.name}) is an allowed edge (agentdb sql has one)",
                )
        if not stateful:
            f.bad("no table with a lifecycle state to guard (see G1, G5)")
        return f.finding(
            "G6",
            core_missing=guarded == 0,
            enforced="a BEFORE UPDATE trigger refuses moves that are not allowed edges on "
            + ", ".join(t.name for _, t in stateful),
        )

    # -- G7 ----------------------------------------------------------------------

    def g7(self) -> Finding:
        f = _Findings()
        core = True
        for t in (self.tasks, self.ops):
            if t is None:
                continue
            v = t.col(*_VERSION)
            if v is None:
                f.bad(
                    f"{t.name} has no version column: a stale worker overwrites newer state",
                    f"ALTER TABLE {t.display} ADD COLUMN state_version bigint NOT NULL DEFAULT 0;",
                )
                continue
            if t is self.tasks:
                core = False
            f.ok(f"column {t.name}.{v.name}")
            f.ok(*(f"check {c.name}" for c in t.checks_on(v.name) if c.columns == (v.name,)))
            guards = [
                g
                for g in t.live_triggers()
                if g.row and g.before and g.on_update and g.reads_old(v.name) and g.raises()
            ]
            if guards:
                f.ok(*(f"trigger {g.name}" for g in guards))
            else:
                f.bad(
                    f"nothing moves {t.name}.{v.name} on every write: only writers that "
                    f"remember '{v.name} = {v.name} + 1' are fenced",
                    f"CREATE TRIGGER {_quote(t.name + '_version_guard')} BEFORE UPDATE ON "
                    f"{t.display} FOR EACH ROW EXECUTE FUNCTION guard_version(); -- RAISE "
                    f"unless NEW.{v.name} = OLD.{v.name} + 1",
                )
        if self.tasks is None:
            f.bad("no task table (see G1)")
        return f.finding(
            "G7",
            core_missing=core,
            enforced="a BEFORE UPDATE trigger requires the version to move by +1 on "
            + ", ".join(t.name for t in (self.tasks, self.ops) if t is not None),
        )

    # -- G8 ----------------------------------------------------------------------

    def g8(self) -> Finding:
        f = _Findings()
        tc = _quote(self.tc)
        ev = self.events
        if ev is None:
            f.bad(
                "no event table (event/audit/log in the name, with event_type or actor_id); "
                "--map events=TABLE names it",
                f"CREATE TABLE events ({tc} uuid NOT NULL, id bigserial, task_id uuid "
                "NOT NULL, event_type text NOT NULL, actor_id text NOT NULL, payload jsonb, "
                f"created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ({tc}, id));",
            )
            return f.finding("G8", core_missing=True, enforced="")
        protected = {op: self._protection(ev, op) for op in ("UPDATE", "DELETE", "TRUNCATE")}
        for by in protected.values():
            f.ok(*by)
        missing_ops = [op for op, by in protected.items() if not by]
        writers = sorted({g for g, p in ev.grants if p in missing_ops})
        if missing_ops:
            revoke = (
                f"\nREVOKE {', '.join(missing_ops)} ON {ev.display} FROM "
                f"{', '.join(_quote(w) if w != 'public' else 'PUBLIC' for w in writers)};"
                if writers
                else ""
            )
            trig = []
            if "UPDATE" in missing_ops or "DELETE" in missing_ops:
                trig.append(
                    f"CREATE TRIGGER {_quote(ev.name + '_append_only')} BEFORE UPDATE OR DELETE "
                    f"ON {ev.display} FOR EACH ROW EXECUTE FUNCTION refuse_change(); "
                    "-- a function that RAISEs"
                )
            if "TRUNCATE" in missing_ops:
                trig.append(
                    f"CREATE TRIGGER {_quote(ev.name + '_no_truncate')} BEFORE TRUNCATE ON "
                    f"{ev.display} FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();"
                )
            f.bad(
                f"{ev.name} is not append-only: {_and(missing_ops)} "
                "of audit rows is neither refused by a trigger nor withheld by privileges"
                + (f" (granted to {', '.join(writers)})" if writers else ""),
                "\n".join(trig) + revoke,
            )
        for t in (self.tasks, self.ops):
            if t is None or t.col(*_STATE) is None:
                continue
            links = [
                g
                for g in t.live_triggers()
                if g.row and (g.on_update or g.on_insert) and g.mentions(ev.name)
            ]
            if links:
                f.ok(*(f"trigger {g.name}" for g in links))
            else:
                f.bad(
                    f"nothing ties a state change of {t.name} to an {ev.name} row in the same "
                    "transaction",
                    f"CREATE CONSTRAINT TRIGGER {_quote(t.name + '_event_required')} AFTER "
                    f"INSERT OR UPDATE ON {t.display} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                    f"EXECUTE FUNCTION require_event(); -- RAISE at commit unless {ev.name} "
                    "has the change",
                )
        core = not protected["UPDATE"] and not protected["DELETE"]
        return f.finding(
            "G8",
            core_missing=core,
            enforced=f"{ev.name} refuses UPDATE, DELETE and TRUNCATE; a deferred trigger "
            "requires an event for every state change",
        )

    def _protection(self, t: _Table, op: str) -> list[str]:
        """Objects that stop ``op`` on ``t``: a raising BEFORE trigger, an INSTEAD rule,
        or privileges - some role other than the owner inserts and none may ``op``
        (the owner is the migration role; writers connect as someone else)."""
        by: list[str] = []
        for g in t.live_triggers():
            fires = {"UPDATE": g.on_update, "DELETE": g.on_delete, "TRUNCATE": g.on_truncate}[op]
            if fires and g.before and g.raises():
                by.append(f"trigger {g.name}")
        event = {"UPDATE": "2", "DELETE": "4"}.get(op)
        by += [f"rule {r.name}" for r in t.rules if r.instead and r.event == event]
        inserters = sorted({g for g, p in t.grants if p == "INSERT"})
        if inserters and not any(p == op for _, p in t.grants):
            withheld = [
                o for o in ("UPDATE", "DELETE", "TRUNCATE") if not any(p == o for _, p in t.grants)
            ]
            by.append(
                f"privileges: {', '.join(inserters)} may INSERT into {t.name}; "
                f"no role but its owner {t.owner} may {', '.join(withheld)}"
            )
        return by

    # -- G9 ----------------------------------------------------------------------

    def g9(self) -> Finding:
        f = _Findings()
        ev = self.events
        core = True
        if ev is None:
            f.bad("no event table (see G8)")
        else:
            payloads = [c for c in ev.columns.values() if c.is_json]
            for c in payloads:
                sized = self._sized(ev, c)
                secret = [
                    k.name
                    for k in ev.checks_on(c.name)
                    if re.search(r"secret|redact|sensitive|pii", k.definition, re.IGNORECASE)
                ]
                if sized:
                    core = False
                    f.ok(*(f"check {n}" for n in sized))
                else:
                    f.bad(
                        f"{ev.name}.{c.name} is unbounded: a whole prompt or provider "
                        "response fits",
                        self._size_fix(ev, c, 8192),
                    )
                if secret:
                    core = False
                    f.ok(*(f"check {n}" for n in secret))
                else:
                    f.bad(
                        f"no CHECK keeps secrets out of {ev.name}.{c.name}",
                        f"ALTER TABLE {ev.display} ADD CONSTRAINT "
                        f"{_quote(ev.name + '_' + c.name + '_no_secrets')} CHECK (NOT "
                        f"jsonb_has_secrets({c.qname})); -- agentdb sql has such a function",
                    )
            keep = ev.col(*_RETENTION)
            if keep is not None:
                core = False
                f.ok(f"column {ev.name}.{keep.name}")
            else:
                f.bad(
                    f"{ev.name} has no retention column: payloads cannot expire apart "
                    "from the audit skeleton",
                    f"ALTER TABLE {ev.display} ADD COLUMN retain_until timestamptz NOT NULL "
                    "DEFAULT now() + interval '400 days';",
                )
        for t in (self.tasks, self.ops, self.outbox):
            if t is None:
                continue
            for c in t.columns.values():
                if not c.is_json:
                    continue
                sized = self._sized(t, c)
                if sized:
                    f.ok(*(f"check {n}" for n in sized))
                else:
                    f.bad(f"{t.name}.{c.name} is unbounded", self._size_fix(t, c, 65536))
        return f.finding(
            "G9",
            core_missing=core,
            enforced=f"every JSON payload has a size CHECK; {ev.name if ev else ''} payloads "
            "are checked for secrets and expire apart from the skeleton",
        )

    @staticmethod
    def _sized(t: _Table, c: _Column) -> list[str]:
        return [
            k.name
            for k in t.checks_on(c.name)
            if re.search(r"\b(octet_length|length|pg_column_size)\(", k.definition)
        ]

    @staticmethod
    def _size_fix(t: _Table, c: _Column, limit: int) -> str:
        return (
            f"ALTER TABLE {t.display} ADD CONSTRAINT {_quote(t.name + '_' + c.name + '_size')} "
            f"CHECK (octet_length({c.qname}::text) <= {limit});"
        )

    # -- G10 -----------------------------------------------------------------------

    def g10(self) -> Finding:
        f = _Findings()
        tc = _quote(self.tc)
        ob = self.outbox
        if ob is None:
            f.bad(
                "no outbox table: a crash between commit and publish loses the message",
                f"CREATE TABLE outbox ({tc} uuid NOT NULL, id uuid NOT NULL DEFAULT "
                "gen_random_uuid(), topic text NOT NULL, payload jsonb NOT NULL, state text NOT "
                "NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')), "
                "attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL "
                f"DEFAULT now(), delivered_at timestamptz, PRIMARY KEY ({tc}, id));\n"
                "CREATE INDEX outbox_pending_idx ON outbox (next_attempt_at) "
                "WHERE state = 'pending';",
            )
            return f.finding("G10", core_missing=True, enforced="")
        f.ok(f"table {ob.name}")
        state = ob.col(*_STATE)
        delivered = ob.col(*_DELIVERED)
        if state is not None and _value_set(ob, state)[0]:
            f.ok(*self._state_evidence(ob, state))
        elif delivered is not None:
            f.ok(f"column {ob.name}.{delivered.name}")
        else:
            f.bad(
                f"{ob.name} has no checked delivery state (state with a CHECK, or delivered_at)",
                f"ALTER TABLE {ob.display} ADD COLUMN delivered_at timestamptz;",
            )
        if delivered is not None and state is not None:
            both = {state.name, delivered.name}
            f.ok(*(f"check {c.name}" for c in ob.of("c") if both <= set(c.columns)))
        pending = [i.name for i in ob.indexes if self._serves_pending(i, state, delivered)]
        if pending:
            f.ok(*(f"index {n}" for n in pending))
        else:
            order = ob.col(*_NEXT_ATTEMPT, "created_at")
            if state is not None:
                where = f"{state.qname} = 'pending'"
            elif delivered is not None:
                where = f"{delivered.qname} IS NULL"
            else:
                where = "... -- your undelivered rows"
            f.bad(
                f"no index serves the relay's query for pending {ob.name} rows",
                f"CREATE INDEX {_quote(ob.name + '_pending_idx')} ON {ob.display} "
                f"({order.qname if order else 'created_at'}) WHERE {where};",
            )
        return f.finding(
            "G10",
            core_missing=False,
            enforced=f"{ob.name} keeps a checked delivery state, indexed for the relay",
        )

    @staticmethod
    def _serves_pending(i: _Index, state: _Column | None, delivered: _Column | None) -> bool:
        """Does the index find undelivered rows (by its predicate or its leading column)?"""
        pred = i.predicate or ""
        if (
            state is not None
            and re.search(rf"(?<![\w\"]){re.escape(state.qname)}\b", pred)
            and re.search(r"'(pending|queued|new|ready|scheduled)'", pred)
        ):
            return True
        if delivered is not None and re.search(
            rf"(?<![\w\"]){re.escape(delivered.qname)}\)? IS NULL|NOT {re.escape(delivered.qname)}",
            pred,
        ):
            return True
        return bool(i.columns) and i.columns[0] in _NEXT_ATTEMPT

    # -- G11 -----------------------------------------------------------------------

    def g11(self) -> Finding:
        f = _Findings()
        tc = _quote(self.tc)
        ob, inbox = self.outbox, self.kinds["inbox"]
        if ob is None:
            return Finding(
                "G11",
                _TITLES["G11"],
                "not_applicable",
                "no outbox, so nothing is relayed to deduplicate (see G10)",
            )
        core = False
        if ob.pk is not None:
            f.ok(f"pk {ob.pk.name}")
        else:
            core = True
            f.bad(
                f"{ob.name} has no primary key: messages have no stable id to deduplicate on",
                f"ALTER TABLE {ob.display} ADD PRIMARY KEY ({ob.q(self.tc)}, id);",
            )
        if inbox is None:
            f.bad(
                "no inbox table records processed message ids on the consumer side",
                f"CREATE TABLE inbox ({tc} uuid NOT NULL, consumer text NOT NULL, message_id "
                "uuid NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), "
                f"PRIMARY KEY ({tc}, consumer, message_id));",
            )
        else:
            mid = inbox.col(*_MESSAGE_ID)
            keys = [(n, cols) for n, cols, _ in inbox.unique_keys()]
            if inbox.pk is not None:
                keys.append((inbox.pk.name, inbox.pk.columns))
            covering = [n for n, cols in keys if mid is not None and mid.name in cols]
            if covering:
                f.ok(*(f"key {n}" for n in covering))
            else:
                f.bad(
                    f"{inbox.name} has no key on a message id: a redelivery is processed again",
                    f"ALTER TABLE {inbox.display} ADD PRIMARY KEY ({tc}, consumer, message_id);",
                )
        return f.finding(
            "G11",
            core_missing=core,
            enforced=f"{ob.name} rows have a stable key; {inbox.name if inbox else ''} "
            "records each processed message id once",
        )

    # -- G12 -----------------------------------------------------------------------

    def g12(self) -> Finding:
        f = _Findings()
        t = self.tasks
        if t is None:
            f.bad("no task table (see G1)")
            return f.finding("G12", core_missing=True, enforced="")
        owner, expires, token = t.col(*_LEASE_OWNER), t.col(*_LEASE_EXPIRES), t.col(*_LEASE_TOKEN)
        if owner is None or expires is None:
            f.bad(
                f"{t.name} has no lease (owner and expiry columns): a crashed worker's "
                "task is never taken over safely",
                f"ALTER TABLE {t.display} ADD COLUMN lease_owner text, ADD COLUMN "
                "lease_acquired_at timestamptz, ADD COLUMN lease_expires_at timestamptz, "
                f"ADD CONSTRAINT {_quote(t.name + '_lease_complete')} CHECK ((lease_owner IS "
                "NULL) = (lease_expires_at IS NULL));",
            )
        else:
            f.ok(f"column {t.name}.{owner.name}", f"column {t.name}.{expires.name}")
            whole = [c.name for c in t.of("c") if {owner.name, expires.name} <= set(c.columns)]
            if whole:
                f.ok(*(f"check {n}" for n in whole))
            else:
                f.bad(
                    f"no CHECK keeps the lease whole: {owner.name} without "
                    f"{expires.name} never expires",
                    f"ALTER TABLE {t.display} ADD CONSTRAINT {_quote(t.name + '_lease_complete')} "
                    f"CHECK (({owner.qname} IS NULL) = ({expires.qname} IS NULL));",
                )
        if token is None:
            f.bad(
                f"{t.name} has no fencing token: a worker whose lease expired can still "
                "complete the task",
                f"ALTER TABLE {t.display} ADD COLUMN lease_token bigint NOT NULL DEFAULT 0; "
                "-- every grant takes a larger token; every holder's write matches it",
            )
        else:
            f.ok(f"column {t.name}.{token.name}")
            guards = [
                g
                for g in t.live_triggers()
                if g.row and g.before and g.on_update and g.reads_old(token.name) and g.raises()
            ]
            if guards:
                f.ok(*(f"trigger {g.name}" for g in guards))
            else:
                f.bad(
                    f"nothing stops {t.name}.{token.name} going backwards or a new lease "
                    "reusing the old token",
                    f"CREATE TRIGGER {_quote(t.name + '_lease_guard')} BEFORE UPDATE ON "
                    f"{t.display} FOR EACH ROW EXECUTE FUNCTION guard_lease(); -- RAISE if "
                    f"NEW.{token.name} < OLD.{token.name} or a new owner keeps the token",
                )
        return f.finding(
            "G12",
            core_missing=owner is None or expires is None,
            enforced=f"{t.name} leases are complete and fenced by a growing token",
        )

    # -- G13 -----------------------------------------------------------------------

    def g13(self) -> Finding:
        f = _Findings()
        ops = self.ops
        if ops is None:
            f.bad("no operation table (see G1)")
            return f.finding("G13", core_missing=True, enforced="")
        state = ops.col(*_STATE)
        ok = 0
        if state is None:
            f.bad(f"{ops.name} has no state column (see G5)")
        else:
            _, values = _value_set(ops, state)
            unknown = sorted((values or frozenset()) & _UNKNOWN_STATES)
            if unknown:
                ok += 1
                f.ok(*(f"{e} (has '{unknown[0]}')" for e in self._state_evidence(ops, state)))
            else:
                f.bad(
                    f"{ops.name}.{state.name} declares no 'unknown' state: an effect whose "
                    "outcome is unknown after a crash looks unsettled or done, not in doubt",
                    f"-- add 'unknown' to the {state.name} CHECK of {ops.name}, e.g.\n"
                    f"ALTER TABLE {ops.display} ADD CONSTRAINT "
                    f"{_quote(ops.name + '_' + state.name + '_valid')} CHECK ({state.qname} IN "
                    f"({_STATE_SETS['operations']}));",
                )
            index = [i.name for i in ops.indexes if _finds_unknown(i, state)]
            if index:
                ok += 1
                f.ok(*(f"index {n}" for n in index))
            else:
                order = ops.col(*_UNSETTLED_ORDER)
                f.bad(
                    f"no index finds unsettled {ops.name} rows for reconciliation",
                    f"CREATE INDEX {_quote(ops.name + '_unsettled_idx')} ON {ops.display} "
                    f"({order.qname if order else 'id'}) WHERE {state.qname} IN "
                    "('reserved', 'in_flight', 'unknown');",
                )
        return f.finding(
            "G13",
            core_missing=ok == 0,
            enforced=f"{ops.name} has an 'unknown' state and an index over unsettled rows; "
            "reserve-before-call is the runtime's API shape",
        )

    # -- G14 -----------------------------------------------------------------------

    def g14(self) -> Finding:
        f = _Findings()
        in_policy = False
        for t in self.cat.tables.values():
            for p in t.policies:
                if _json_path_use(p.qual, t) or _json_path_use(p.with_check, t):
                    in_policy = True
                    f.bad(
                        f"policy {p.name} on {t.name} decides access from a JSON path",
                        f"-- promote the JSON field policy {p.name} reads to a typed column of "
                        f"{t.name} and rewrite the policy on it",
                    )
            for i in t.indexes:
                if _json_path_use(i.expressions, t) or _json_path_use(i.predicate, t):
                    f.bad(
                        f"index {i.name} on {t.name} serves a query on a JSON path",
                        f"-- promote the JSON field index {i.name} reads to a typed column of "
                        f"{t.name} and index that",
                    )
            for c in t.of("c"):
                if _json_path_use(c.definition, t):
                    f.bad(
                        f"CHECK {c.name} on {t.name} validates a JSON path",
                        f"-- promote the JSON field {c.name} checks to a typed column of {t.name}",
                    )
        for t in self.cat.tables.values():
            f.ok(*(f"json column {t.name}.{c.name}" for c in t.columns.values() if c.is_json))
        return f.finding(
            "G14",
            core_missing=in_policy,
            enforced="no index, policy or CHECK reads a JSON path; JSON holds only payloads",
        )

    # -- G15 -----------------------------------------------------------------------

    def g15(self) -> Finding:
        f = _Findings()
        owned = self.owned
        if not owned:
            f.bad(f"no tenant-owned tables (no {self.tc} column) to scope (see G2)")
            return f.finding("G15", core_missing=True, enforced="")
        enabled = [t for t in owned if t.rls]
        for t in owned:
            if not t.rls:
                f.bad(
                    f"row-level security is off on {t.name}: any role with SELECT sees "
                    "every tenant",
                    f"ALTER TABLE {t.display} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL "
                    f"SECURITY;\nCREATE POLICY {_quote(t.name + '_tenant_scope')} ON {t.display} "
                    f"USING ({t.q(self.tc)} = current_setting('app.tenant_id')::uuid);",
                )
            elif not t.force_rls:
                f.bad(
                    f"row-level security on {t.name} is enabled but not forced: its owner "
                    "bypasses it",
                    f"ALTER TABLE {t.display} FORCE ROW LEVEL SECURITY;",
                )
            else:
                f.ok(f"rls {t.name} (enabled, forced)")
            for p in t.policies:
                if "public" in p.roles and p.permissive and (p.qual or "true") == "true":
                    f.bad(
                        f"policy {p.name} opens every row of {t.name} to PUBLIC",
                        f"DROP POLICY {_quote(p.name)} ON {t.display};",
                    )
                else:
                    f.ok(f"policy {p.name}")
            public_writes = sorted(
                p
                for g, p in t.grants
                if g == "public" and p in ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
            )
            if public_writes:
                f.bad(
                    f"PUBLIC may {', '.join(public_writes)} {t.name}",
                    f"REVOKE {', '.join(public_writes)} ON {t.display} FROM PUBLIC;",
                )
        if self.cat.role_super or self.cat.role_bypassrls:
            what = "a superuser" if self.cat.role_super else "BYPASSRLS"
            f.bad(
                f"connected as {self.cat.role}, which is {what}: row-level security does not "
                "apply to it (audit as the role the runtime connects as)",
                f"ALTER ROLE {_quote(self.cat.role)} NOSUPERUSER NOBYPASSRLS; -- or give the "
                "runtime its own role",
            )
        else:
            f.ok(f"role {self.cat.role} (no superuser, no BYPASSRLS)")
        for member, via, is_super, _ in self.cat.elevated:
            what = "a superuser" if is_super else "BYPASSRLS"
            f.bad(
                f"role {member} is {what} and inherits {via}, which policies name: RLS does "
                "not apply to it",
                f"ALTER ROLE {_quote(member)} NOSUPERUSER NOBYPASSRLS;",
            )
        return f.finding(
            "G15",
            core_missing=not enabled,
            enforced=f"row-level security enabled and forced on {len(owned)} tenant-owned "
            "tables; no role the policies name bypasses it",
        )

    # -- G16 -----------------------------------------------------------------------

    def g16(self) -> Finding:
        f = _Findings()
        present = 0
        for t in (self.tasks, self.ops):
            if t is None:
                continue
            missing = [n for n in ("trace_id", "span_id") if n not in t.columns]
            if missing:
                f.bad(
                    f"{t.name} has no {' or '.join(missing)} column: a bad row cannot be "
                    "traced to the run that wrote it",
                    f"ALTER TABLE {t.display} "
                    + ", ".join(f"ADD COLUMN {n} text" for n in missing)
                    + ", "
                    + ", ".join(
                        f"ADD CONSTRAINT {_quote(t.name + '_' + n + '_format')} CHECK ({n} ~ "
                        f"'^[0-9a-f]{{{32 if n == 'trace_id' else 16}}}$')"
                        for n in missing
                    )
                    + ";",
                )
            else:
                present += 1
        for t in (self.tasks, self.ops, self.events, self.outbox):
            if t is None:
                continue
            for n, width in (("trace_id", 32), ("span_id", 16)):
                c = t.columns.get(n)
                if c is None:
                    continue
                f.ok(f"column {t.name}.{n}")
                formats = [k.name for k in t.checks_on(n) if k.columns == (n,)]
                if formats:
                    f.ok(*(f"check {x}" for x in formats))
                else:
                    f.bad(
                        f"{t.name}.{n} has no format CHECK (W3C: {width} lowercase hex digits)",
                        f"ALTER TABLE {t.display} ADD CONSTRAINT "
                        f"{_quote(t.name + '_' + n + '_format')} CHECK ({c.qname} ~ "
                        f"'^[0-9a-f]{{{width}}}$');",
                    )
        if self.tasks is None and self.ops is None:
            f.bad("no task or operation table (see G1)")
        return f.finding(
            "G16",
            core_missing=present == 0,
            enforced="tasks and operations carry format-checked W3C trace and span ids",
        )

    # -- G17 -----------------------------------------------------------------------

    def g17(self) -> Finding:
        f = _Findings()
        tc = self.tc
        owned = self.owned
        tenants = self.tenants_oid
        if tenants is None:
            f.bad(
                f"no tenants table: nothing {tc} references, so deleting a tenant leaves its "
                "rows behind unnoticed",
                "CREATE TABLE tenants (id uuid PRIMARY KEY, name text NOT NULL);\n"
                + "\n".join(
                    f"ALTER TABLE {t.display} ADD CONSTRAINT {_quote(t.name + '_tenant_fkey')} "
                    f"FOREIGN KEY ({t.q(tc)}) REFERENCES tenants (id);"
                    for t in owned
                ),
            )
        else:
            tenants_table = self.cat.by_oid(tenants)
            f.ok(f"table {tenants_table.name if tenants_table else tenants}")
        anchored = self._anchored(tenants)
        if tenants is not None:
            for t in owned:
                if t.oid not in anchored:
                    f.bad(
                        f"{t.name} reaches the tenants table through no NOT NULL foreign key: "
                        "its rows outlive their tenant",
                        f"ALTER TABLE {t.display} ADD CONSTRAINT "
                        f"{_quote(t.name + '_tenant_fkey')} FOREIGN KEY ({t.q(tc)}) REFERENCES "
                        f"{self._tenants_display()} (id);",
                    )
        owned_oids = {t.oid for t in owned}
        restrict = 0
        for t in self.cat.tables.values():
            for fk in t.of("f"):
                if not (t.oid in owned_oids or fk.ref_oid in owned_oids or fk.ref_oid == tenants):
                    continue
                if fk.on_delete in ("a", "r"):
                    restrict += 1
                    f.ok(f"fk {fk.name}")
                    continue
                verb = _DELETE_RULES[fk.on_delete]
                parent = fk.ref_display
                f.bad(
                    f"{fk.name} ON DELETE {verb} {t.name} rows when a {parent} row goes",
                    f"ALTER TABLE {t.display} DROP CONSTRAINT {fk.qname}, ADD CONSTRAINT "
                    f"{fk.qname} FOREIGN KEY ({_cols([t.q(c) for c in fk.columns])}) REFERENCES "
                    f"{parent} ({_cols(fk.ref_columns)}); -- NO ACTION: deletion goes through "
                    "an explicit routine",
                )
        creds = self.kinds["credentials"]
        if creds is not None:
            secretish = [c for c in creds.columns.values() if _SECRET_COLUMN.search(c.name)]
            for c in secretish:
                refs = [
                    k.name
                    for k in creds.checks_on(c.name)
                    if re.search(r" ~\*? | LIKE | SIMILAR TO |starts_with\(|secret", k.definition)
                ]
                if refs:
                    f.ok(*(f"check {n}" for n in refs))
                else:
                    f.bad(
                        f"{creds.name}.{c.name} may hold a secret value: no CHECK makes it "
                        "a reference",
                        f"ALTER TABLE {creds.display} ADD CONSTRAINT "
                        f"{_quote(creds.name + '_is_reference')} CHECK ({c.qname} ~ "
                        "'^[a-z][a-z0-9+.-]*://[^[:space:]]+$');",
                    )
        routines = [r for r in self.cat.routines if _DELETION_ROUTINE.search(r.lower())]
        f.ok(*(f"routine {r}" for r in routines))
        how = f"routine {routines[0]}" if routines else "an explicit routine"
        return f.finding(
            "G17",
            core_missing=tenants is None or not anchored,
            enforced=f"every tenant-owned table is anchored to its tenant by {restrict} "
            f"RESTRICT/NO ACTION foreign keys, so tenant data goes only through {how}"
            + ("; credentials are CHECKed references" if creds is not None else ""),
        )

    def _tenants_display(self, oid: int | None = None) -> str:
        t = self.kinds.get("tenants")
        if t is not None:
            return t.display
        wanted = self.tenants_oid if oid is None else oid
        for table in self.cat.tables.values():
            for fk in table.of("f"):
                if fk.ref_oid == wanted:
                    return fk.ref_display
        return "tenants"

    def _anchored(self, tenants: int | None) -> set[int]:
        """Tenant-owned tables whose rows cannot exist without their tenant's row."""
        if tenants is None:
            return set()
        anchored: set[int] = set()
        changed = True
        while changed:
            changed = False
            for t in self.owned:
                if t.oid in anchored:
                    continue
                for fk in t.of("f"):
                    required = all(t.columns[c].notnull for c in fk.columns)
                    if (fk.ref_oid == tenants and fk.columns == (self.tc,)) or (
                        required and fk.ref_oid in anchored
                    ):
                        anchored.add(t.oid)
                        changed = True
                        break
        return anchored


# --- command line -----------------------------------------------------------------


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``audit`` subcommand to ``agentdb``'s subparsers."""
    p = sub.add_parser(
        "audit",
        help="report which guarantees G1-G17 an existing schema enforces",
        description="Read the catalog of one schema (read-only) and report, for each "
        "guarantee G1-G17, whether it is enforced, partial, missing or not applicable, "
        "with the objects that enforce it and a suggested fix.",
    )
    p.add_argument("--dsn", help="postgresql:// URL (default: $DATABASE_URL)")
    p.add_argument("--schema", help="schema to audit (default: first on the search_path)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="KIND=TABLE[,...]",
        help="assign tables to roles: tasks, operations, events, outbox, inbox, tenants, "
        "credentials (TABLE '-' for none); tenant=COLUMN names the tenant column",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (schema: README)")
    p.add_argument(
        "--fail-on",
        choices=("missing", "partial"),
        help=f"exit {EXIT_FINDINGS} if any guarantee is missing (or partial or missing)",
    )
    p.set_defaults(func=_cmd_audit)


def _cmd_audit(args: argparse.Namespace) -> int:
    dsn: str | None = args.dsn or os.environ.get("DATABASE_URL")
    if not dsn:
        raise ConfigurationError("no database given: pass --dsn or set DATABASE_URL")
    report = audit(dsn, schema=args.schema, mapping=parse_mapping(args.map))
    sys.stdout.write(report.to_json() + "\n" if args.json else report.render())
    code = report.exit_code(args.fail_on)
    if code:
        counts = report.summary()
        print(
            f"agentdb: audit failed (--fail-on {args.fail_on}): {counts['missing']} missing, "
            f"{counts['partial']} partial",
            file=sys.stderr,
        )
    return code
