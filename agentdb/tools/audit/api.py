"""Which of agentdb's guarantees (:mod:`agentdb.guarantees`) does an existing schema enforce?

:func:`audit` reads the live catalog of one schema (``pg_catalog`` only,
inside a READ ONLY transaction, so a role with no table privileges can run
it and it writes nothing) and reports one :class:`Finding` per guarantee:

* ``enforced`` - named constraints, triggers, policies or grants enforce it
  (``evidence`` names them);
* ``partial`` - part of it is enforced; ``problems`` says what is missing;
* ``missing`` - nothing in the schema enforces it;
* ``not_applicable`` - the schema has nothing the guarantee is about (G11
  when nothing is relayed through an outbox).

Every finding has a one-line ``reason`` and, unless enforced, a suggested
SQL ``fix`` (shown, never executed). Schemas agentdb did not create work
too: :mod:`agentdb.tools.audit.detect` says how tables are given roles.

Usage::

    report = audit("postgresql://auditor@db/app", mapping={"tasks": "jobs"})
    assert report.exit_code("partial") == 0, report.render()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from agentdb.tools.audit import catalog
from agentdb.tools.audit.catalog import AuditError
from agentdb.tools.audit.checks_access import check_g14, check_g15, check_g16, check_g17
from agentdb.tools.audit.checks_budgets import check_g19
from agentdb.tools.audit.checks_children import check_g23
from agentdb.tools.audit.checks_citus import citus_notes
from agentdb.tools.audit.checks_control import check_g20, check_g21
from agentdb.tools.audit.checks_delivery import check_g10, check_g11, check_g12, check_g13
from agentdb.tools.audit.checks_fairness import check_g18
from agentdb.tools.audit.checks_keys import check_g1, check_g2, check_g3, check_g4, check_g5
from agentdb.tools.audit.checks_lifecycle import check_g6, check_g7, check_g8, check_g9
from agentdb.tools.audit.checks_schedules import check_g24
from agentdb.tools.audit.checks_signals import check_g22
from agentdb.tools.audit.checks_steps import check_g25
from agentdb.tools.audit.detect import MAP_KEYS, Context, detect, parse_mapping
from agentdb.tools.audit.report import (
    EXIT_FINDINGS,
    JSON_SCHEMA,
    STATUSES,
    Finding,
    Report,
    TableRef,
)

__all__ = [
    "CHECKS",
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
]

# Not API: the tests open the audit's connection to prove it cannot write.
_read_only = catalog.read_only

#: One check per guarantee, in the registry's order (the order the report lists them).
CHECKS: Final[tuple[Callable[[Context], Finding], ...]] = (
    check_g1,
    check_g2,
    check_g3,
    check_g4,
    check_g5,
    check_g6,
    check_g7,
    check_g8,
    check_g9,
    check_g10,
    check_g11,
    check_g12,
    check_g13,
    check_g14,
    check_g15,
    check_g16,
    check_g17,
    check_g18,
    check_g19,
    check_g20,
    check_g21,
    check_g22,
    check_g23,
    check_g24,
    check_g25,
)


def audit(
    dsn: str, *, schema: str | None = None, mapping: Mapping[str, str] | None = None
) -> Report:
    """Audit one schema of the database at ``dsn`` against every guarantee.

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
    with _read_only(dsn) as conn:
        cat = catalog.snapshot(conn, schema)
    return judge(cat, mapping)


def judge(cat: catalog.Catalog, mapping: Mapping[str, str] | None = None) -> Report:
    """The report on a catalog snapshot already read (the tests read one inside a
    transaction that applied a suggested fix, then roll it back).

    Raises:
        ConfigurationError: a mapping naming an unknown key, a missing table or column.
    """
    ctx = detect(cat, dict(mapping or {}))
    return Report(
        database=cat.database,
        schema=cat.schema,
        role=cat.role,
        server_version=cat.server_version,
        tenant_column=ctx.tc,
        tables=ctx.refs,
        findings=[check(ctx) for check in CHECKS],
        notes=[*ctx.notes, *citus_notes(ctx)],
    )
