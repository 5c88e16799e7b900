"""What the checks share: the collector that turns evidence and gaps into a finding.

Also the reading of a column's declared values (an enum, a domain, a CHECK
listing them), which G5, G10 and G13 all rest on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from agentdb.guarantees import GUARANTEES
from agentdb.tools.audit.catalog import Column, Table
from agentdb.tools.audit.report import Finding, Status

__all__ = [
    "STATE_SETS",
    "TENANCY",
    "Findings",
    "column_list",
    "not_applicable",
    "single_tenant",
    "state_evidence",
    "value_set",
]

#: Guarantees about tenants; a single-tenant schema has nothing they apply to.
TENANCY: Final = frozenset({"G2", "G15", "G17", "G18"})

# Placeholder state sets for fixes, taken from agentdb's own tables.
STATE_SETS: Final[Mapping[str, str]] = {
    "tasks": "'pending', 'waiting', 'running', 'succeeded', 'failed', 'cancelled', 'dead'",
    "operations": "'reserved', 'in_flight', 'succeeded', 'failed', 'unknown'",
    "outbox": "'pending', 'delivered', 'dead'",
}


class Findings:
    """Collects evidence, problems and fixes for one guarantee."""

    def __init__(self) -> None:
        self.evidence: list[str] = []
        self.problems: list[str] = []
        self.fixes: list[str] = []

    def ok(self, *evidence: str) -> None:
        """Record objects the guarantee rests on (each once, in first-seen order)."""
        for e in evidence:
            if e not in self.evidence:
                self.evidence.append(e)

    def bad(self, problem: str, fix: str | None = None) -> None:
        """Record a gap and the SQL that would close it (each fix once)."""
        self.problems.append(problem)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)

    def finding(self, gid: str, *, core_missing: bool, enforced: str) -> Finding:
        """No problems: enforced (``enforced`` is the reason). Otherwise missing when
        ``core_missing`` says the heart of the guarantee is absent, else partial.

        Raises:
            KeyError: ``gid`` is not a guarantee of the registry.
        """
        title = GUARANTEES[gid].title
        if not self.problems:
            return Finding(gid, title, "enforced", enforced, tuple(self.evidence))
        status: Status = "missing" if core_missing else "partial"
        first = self.problems[0]
        more = len(self.problems) - 1
        reason = first if not more else f"{first} (+{more} more)"
        return Finding(
            gid,
            title,
            status,
            reason,
            tuple(self.evidence),
            tuple(self.problems),
            "\n".join(self.fixes) or None,
        )


def not_applicable(gid: str, reason: str) -> Finding:
    """The finding for a guarantee the schema has nothing to apply to.

    Raises:
        KeyError: ``gid`` is not a guarantee of the registry.
    """
    return Finding(gid, GUARANTEES[gid].title, "not_applicable", reason)


def single_tenant(gid: str, single: bool, tc: str, candidate: str | None = None) -> Finding | None:
    """The finding of a tenancy guarantee on a single-tenant schema, else ``None``.

    The report's notes say once that the schema is single-tenant; each such
    finding points there instead of repeating that no table has a tenant.
    With ``candidate`` (a column that may be the tenant) it names the
    ``--map`` to judge the guarantee by instead.

    Raises:
        KeyError: ``gid`` is not a guarantee of the registry.
    """
    if not single:
        return None
    if candidate is not None:
        return not_applicable(
            gid, f"no {tc} column; if {candidate} is the tenant: --map tenant={candidate}"
        )
    return not_applicable(gid, f"single-tenant schema (no {tc} column; see the note)")


def value_set(table: Table, column: Column) -> tuple[bool, frozenset[str] | None]:
    """Is the column's value set declared, and what is it (None if not a list)?

    Counts an enum type, a domain or a CHECK that compares the column with a
    list (``IN``/``= ANY``) or a pattern, and a foreign key on it. A CHECK
    whose list is one side of an OR (``state IN (...) OR attempts >= 0``)
    bounds nothing, and a domain's other CHECKs (a length) are no value set.
    """
    if column.enum_labels:
        return True, frozenset(column.enum_labels)
    for definition in column.domain_checks:
        values = _listed(definition, "VALUE")
        if values is not None:
            return True, values
        if _matched(definition, "VALUE"):
            return True, None
    for con in table.checks_on(column.name):
        values = _listed(con.definition, column.qname)
        if values is not None:
            return True, values
        if con.columns == (column.name,) and _matched(con.definition, column.qname):
            return True, None
    if any(column.name in fk.columns for fk in table.of("f")):
        return True, None
    return False, None


def _binding(definition: str, qcol: str) -> bool:
    """No OR in ``definition`` but "``qcol`` IS NULL" ones: what it says of ``qcol`` holds."""
    bare = re.sub(r"'(?:[^']|'')*'", "''", definition)  # string literals may say OR
    bare = re.sub(rf"\(*{re.escape(qcol)}\)* IS NULL", "", bare)
    return re.search(r"\bOR\b", bare) is None


def _matched(definition: str, qcol: str) -> bool:
    """Whether a CHECK ``definition`` holds ``qcol`` to a pattern (``~``)."""
    found = re.search(rf"(?<![\w\"]){re.escape(qcol)}\)?(::[\w ]+)?\)? ~", definition)
    return found is not None and _binding(definition, qcol)


def _listed(definition: str, qcol: str) -> frozenset[str] | None:
    """The values a CHECK ``definition`` lists for ``qcol``, ``None`` if it lists none."""
    if not _binding(definition, qcol):
        return None
    # pg_get_constraintdef prints `col IN (...)` as `(col = ANY (ARRAY['a'::text, ...]))`.
    pattern = (
        rf"(?<![\w\"])\(*{re.escape(qcol)}\)*(?:::[\w ]+)?\s*=\s*ANY\s*"
        r"\(+ARRAY\[(?P<items>[^\]]*)\]"
    )
    m = re.search(pattern, definition)
    if m is None:
        return None
    return frozenset(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", m["items"]))


def state_evidence(t: Table, state: Column) -> list[str]:
    """The objects that declare a state column's values, as evidence names them."""
    if state.enum_labels:
        return [f"enum {t.name}.{state.name} ({state.type})"]
    if state.domain_checks:
        return [f"domain {t.name}.{state.name} ({state.type})"]
    names = [
        c.name for c in t.checks_on(state.name) if _listed(c.definition, state.qname) is not None
    ]
    return [f"check {n}" for n in names] or [f"fk on {t.name}.{state.name}"]


def column_list(columns: Sequence[str]) -> str:
    """Column names as a SQL list shows them."""
    return ", ".join(columns)
