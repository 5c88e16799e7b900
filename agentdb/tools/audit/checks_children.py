"""Check G23: a parent is woken once by its children, in its own tenant.

What the catalog can show, for a task table with a parent reference (a
foreign key to itself, or a ``parent_id``-like column):

* a row trigger on it that fires AFTER an UPDATE and reads the parent column:
  the fan-in happens in the database, in the transaction of the child's
  finish, where it can lock the parent row and count the siblings. A fan-in
  in the workers' code (the last child to finish, as each sees it, wakes the
  parent) wakes it twice when two children finish at once, or never;
* the self-reference is a composite foreign key with the tenant column, so a
  child belongs to a task of its own tenant;
* a unique key of the parent column and another column: a retried fan-out
  creates each child once.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import columns
from agentdb.tools.audit.catalog import Table, keyed_rows, quote
from agentdb.tools.audit.checks_control import finals
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g23"]

_PARENT = re.compile(r"^(parent_id|parent_task_id|parent_uuid|parent_job_id|parent)$")


def _parent(t: Table) -> tuple[str | None, list[str]]:
    """The parent column, and the columns of the self-referencing foreign key (if any)."""
    for fk in t.of("f"):
        if fk.ref_oid == t.oid:
            key = t.pk_columns()
            own = [c for c in fk.columns if c not in key or len(fk.columns) == 1]
            return (own[-1] if own else fk.columns[-1]), list(fk.columns)
    named = next((c.name for c in t.columns.values() if _PARENT.match(c.name)), None)
    return named, []


def _fan_in_fix(t: Table, parent: str, scope: tuple[str, ...]) -> str | None:
    state, wake = columns.state(t), columns.wake(t)
    key = t.pk_columns()
    if state is None or wake is None or not key:
        return None
    fn = quote(t.name + "_fan_in")
    own = key[-1]
    match = " AND ".join([*(f"p.{t.q(c)} = NEW.{t.q(c)}" for c in scope),
                          f"p.{t.q(own)} = NEW.{t.q(parent)}"])  # fmt: skip
    siblings = " AND ".join([*(f"c.{t.q(c)} = NEW.{t.q(c)}" for c in scope),
                             f"c.{t.q(parent)} = NEW.{t.q(parent)}"])  # fmt: skip
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in finals(t))
    # Suggested text shown to a DBA; the audit never executes it (S608).
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        "BEGIN\n"
        f"  PERFORM 1 FROM {t.display} p WHERE {match}\n"
        "    FOR UPDATE;  -- siblings finishing at once take turns; the last counts them all\n"
        f"  IF NOT EXISTS (SELECT 1 FROM {t.display} c WHERE {siblings}\n"
        f"                 AND c.{state.qname}::text NOT IN ({listed})) THEN\n"
        f"    UPDATE {t.display} p SET {wake.qname} = now() WHERE {match}\n"
        f"      AND p.{wake.qname} > now();  -- once: a woken parent is not woken again\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(t.name + '_fan_in')} AFTER UPDATE OF {state.qname} ON {t.display} "
        f"FOR EACH ROW WHEN (NEW.{t.q(parent)} IS NOT NULL) EXECUTE FUNCTION {fn}();"
    )


def check_g23(ctx: Context) -> Finding:
    """G23: a fan-in trigger on tasks that reads the parent column; a tenant-scoped parent key."""
    t = ctx.tasks
    if t is None:
        return not_applicable("G23", "no task table: nothing has children")
    parent, fk = _parent(t)
    if parent is None:
        return not_applicable("G23", f"{t.name} has no parent reference: tasks have no children")
    f = Findings()
    fan_in = [
        g for g in t.live_triggers()
        if g.row and g.on_update and not g.before and g.mentions(parent)
    ]  # fmt: skip
    if fan_in:
        f.ok(*(f"trigger {g.name}" for g in fan_in))
    else:
        f.bad(
            f"no trigger on {t.name} reads {parent} after an update: the fan-in is left to the "
            "workers, and two children finishing at once can both wake their parent - or "
            "neither",
            _fan_in_fix(t, parent, ctx.scope),
        )
    key = t.pk_columns()
    if fk and set(ctx.scope) <= set(fk):
        f.ok(f"column {t.name}.{parent}")
    elif key and set(ctx.scope) <= set(key):
        cols = ", ".join(quote(c) for c in (*ctx.scope, parent))
        refs = ", ".join(quote(c) for c in key)
        f.bad(
            f"{t.name}.{parent} is not a foreign key with {ctx.tc}: a child can name "
            "another tenant's task as its parent, or none",
            f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_parent_fkey')} "
            f"FOREIGN KEY ({cols}) REFERENCES {t.display} ({refs});",
        )
    else:
        f.bad(f"{t.name}.{parent} is not a foreign key with {ctx.tc}: a child can name "
              "another tenant's task as its parent")  # fmt: skip
    unique = any(
        parent in cols and len([c for c in cols if c not in (*ctx.scope, parent)]) >= 1
        for _, cols, predicate in t.unique_keys()
        if keyed_rows(predicate, cols)
    )
    if not unique:
        f.bad(
            f"no unique key on {t.name} holds {parent} and a child key: a retried fan-out "
            "creates its children twice"
        )
    return f.finding(
        "G23",
        core_missing=not fan_in,
        enforced=f"a trigger on {t.name} wakes a parent from its children's finishes, "
        f"and {parent} is a foreign key with {ctx.tc}",
    )
