"""Check G22: a signal reaches its task once, in order, and never a finished one.

What the catalog can show, for a table named like signals or approvals that
refers to the task table:

* a row trigger on it that fires on INSERT, reads the task table with a row
  lock and can refuse - the place where a signal to a finished task is
  refused and where senders serialise on the task row (so seq order is commit order, and a
  signal cannot slip between a handler deciding to wait and its wait). A
  check in the sender's code is skipped by every other sender;
* a unique key on the task reference plus an integer column: each signal's
  place in its task's order, so a reader that has seen n has seen 1..n.

Who wakes the waiting task, and whether the handler reads each signal once,
is the application's business; what the schema refuses is reported.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import columns, fixes
from agentdb.tools.audit.catalog import Table, quote
from agentdb.tools.audit.checks_control import finals, link_to_tasks
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g22"]

_SIGNAL_NAME = re.compile(r"(^|_)(signals?|approvals?)($|_)")
_INTEGER = frozenset({"smallint", "integer", "bigint", "int2", "int4", "int8"})
_ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|SHARE|KEY\s+SHARE)\b", re.I)


def _signal_table(ctx: Context, tasks: Table) -> Table | None:
    for t in sorted(ctx.cat.tables.values(), key=lambda t: t.name):
        named = _SIGNAL_NAME.search(t.name.lower()) is not None
        if t.oid != tasks.oid and named and columns.task_ref(t, tasks):
            return t
    return None


def _order_key(s: Table, refs: list[str], scope: tuple[str, ...]) -> str | None:
    """A unique key of the task reference plus an integer column: the signal's place."""
    for name, cols, predicate in s.unique_keys():
        rest = [c for c in cols if c not in refs and c not in scope]
        if (
            predicate is None
            and set(refs) <= set(cols)
            and rest
            and all(c in s.columns and s.columns[c].base in _INTEGER for c in rest)
        ):
            return name
    return None


def _guard_fix(ctx: Context, s: Table, tasks: Table, link: list[tuple[str, str]]) -> str:
    state = columns.state(tasks)
    fn = fixes.name(ctx, s.name + "_guard")
    match = " AND ".join(f"t.{tasks.q(tc)} = NEW.{s.q(sc)}" for sc, tc in link)
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in finals(tasks))
    finished = (
        f"  IF st IN ({listed}) THEN\n"
        f"    RAISE EXCEPTION '{fixes.said(s.name)}: task % is %; it takes no more signals',\n"
        f"      NEW.{s.q(link[-1][0])}, st USING ERRCODE = 'check_violation';\n"
        "  END IF;\n"
        if state is not None
        else ""
    )
    read = f"t.{tasks.q(state.name)}::text" if state is not None else "NULL::text"
    # Suggested text shown to a DBA; the audit never executes it (S608).
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        "DECLARE\n"
        "  st text;\n"
        "BEGIN\n"
        f"  SELECT {read} INTO st FROM {tasks.display} t WHERE {match}\n"
        "    FOR NO KEY UPDATE;  -- senders to one task serialise: seq order is commit order\n"
        f"{finished}"
        "  RETURN NEW;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(s.name + '_guard')} BEFORE INSERT ON {s.display} "
        f"FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def check_g22(ctx: Context) -> Finding:
    """G22: a signal table whose inserts a trigger checks against the task, in task order."""
    tasks = ctx.tasks
    if tasks is None:
        return not_applicable("G22", "no task table: nothing to signal")
    s = _signal_table(ctx, tasks)
    if s is None:
        return not_applicable(
            "G22", f"no signal or approval table refers to {tasks.name}: nothing is signalled"
        )
    link = link_to_tasks(s, tasks)
    f = Findings()
    # The guard locks the task row: a trigger that only looks (as agentdb's
    # agent_signals_access does, for the sender's visibility) does not serialise senders.
    guards = [g for g in s.guards_reading([tasks], "insert") if _ROW_LOCK.search(g.source)]
    if guards:
        f.ok(*(f"trigger {g.name}" for g in guards))
    else:
        f.bad(
            f"no trigger on {s.name} reads {tasks.name} under a row lock when a signal is "
            "inserted: a signal "
            f"can be sent to a finished task, and two senders to one task do not serialise, "
            "so their order can differ from their commits",
            _guard_fix(ctx, s, tasks, link),
        )
    refs = [sc for sc, _ in link]
    order = _order_key(s, refs, ctx.scope)
    if order is not None:
        f.ok(f"unique key {order}")
    else:
        key = ", ".join(quote(c) for c in refs)
        add = "" if "seq" in s.columns else f"ALTER TABLE {s.display} ADD COLUMN seq bigint;\n"
        f.bad(
            f"no unique key on {s.name} gives a signal its place in its task's order "
            "(the task reference plus a sequence number): a reader cannot tell it has seen "
            "every signal before the last one it read",
            f"{add}ALTER TABLE {s.display} ADD CONSTRAINT {quote(s.name + '_seq_key')} "
            f"UNIQUE ({key}, seq);",
        )
    return f.finding(
        "G22",
        core_missing=not guards,
        enforced=f"a trigger on {s.name} checks each signal against its {tasks.name} row, "
        "and a unique key orders them",
    )
