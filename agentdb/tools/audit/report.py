"""What the audit says: one :class:`Finding` per guarantee, gathered in a :class:`Report`.

Plain data with no database behind it, so a report can be rendered,
serialised or judged (:meth:`Report.exit_code`) anywhere; the shape of its
JSON is :data:`JSON_SCHEMA`, which the README documents.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from agentdb.errors import ConfigurationError
from agentdb.guarantees import GUARANTEES

__all__ = [
    "EXIT_FINDINGS",
    "JSON_SCHEMA",
    "KINDS",
    "REPORT_VERSION",
    "STATUSES",
    "Finding",
    "Report",
    "Status",
    "TableRef",
]

Status: TypeAlias = Literal["enforced", "partial", "missing", "not_applicable"]
STATUSES: Final[tuple[Status, ...]] = ("enforced", "partial", "missing", "not_applicable")
#: Exit status of ``agentdb audit --fail-on ...`` when a guarantee is below the bar
#: (1 is kept for database problems and 2 for bad input, as in every command).
EXIT_FINDINGS: Final = 3
#: Version of the JSON document :meth:`Report.to_json` writes; bumped on any
#: incompatible change to :data:`JSON_SCHEMA`.
REPORT_VERSION: Final = 1

#: The roles a table can play, in the order a report lists them.
KINDS: Final = ("tasks", "operations", "events", "outbox", "inbox", "tenants", "credentials")


@dataclass(frozen=True, slots=True)
class Finding:
    """What the schema does about one guarantee.

    Attributes:
        guarantee: ``"G1"`` ... ``"G19"``.
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
    evidence: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class TableRef:
    """The table playing one role, and whether ``--map`` or the heuristics chose it."""

    name: str
    source: Literal["map", "heuristic"]


@dataclass(frozen=True, slots=True)
class Report:
    """The audit of one schema: one finding per guarantee, in the registry's order."""

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
            if f.status == "partial" and f.evidence:
                # A partial verdict names what does hold, not only what is missing.
                shown = f.evidence[:max_evidence]
                more = len(f.evidence) - len(shown)
                tail = f", ... (+{more} more)" if more > 0 else ""
                lines.append(f"{pad}holds: {', '.join(shown)}{tail}")
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
            "required": list(KINDS),
            "additionalProperties": False,
            "properties": {kind: {"$ref": "#/$defs/table"} for kind in KINDS},
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
            "minItems": len(GUARANTEES),
            "maxItems": len(GUARANTEES),
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
                "guarantee": {"type": "string", "pattern": "^G([1-9]|1[0-9]|2[0-5])$"},
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
