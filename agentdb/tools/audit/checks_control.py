"""Checks G20-G21: a cancel and a deadline end a task for every writer (G22 shares helpers).

G20: a finished (cancelled) task takes no new operation, whoever writes it.

What the catalog can show: a row trigger on the operation table that fires
on INSERT, reads the task table and can refuse. A cancel that only the
application's workers respect leaves every other writer - a raw INSERT, a
worker that missed the cancel - free to start an effect for a task that is
over. Whether the cancel also takes the worker's lease is the application's
business; what the schema refuses is what is reported.

G21: a task table with a deadline column, and a row trigger that reads the
old deadline before an UPDATE and can refuse: past the deadline only a move
to a final state gets through. A claim path that skips late tasks is the
application's; a finish written after the deadline is the schema's to refuse.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import columns, fixes
from agentdb.tools.audit.catalog import Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g20", "check_g21", "finals", "link_to_tasks"]

_DEADLINE = re.compile(r"^(deadline|deadline_at|timeout_at|due_by|finish_by)$")


def link_to_tasks(ops: Table, tasks: Table) -> list[tuple[str, str]]:
    """(column, task column) pairs that tie a row of ``ops`` (operation, signal) to its task."""
    for fk in ops.of("f"):
        if fk.ref_oid == tasks.oid and fk.ref_oid != ops.oid:
            return list(zip(fk.columns, fk.ref_columns, strict=True))
    refs = columns.task_ref(ops, tasks)
    key = tasks.pk_columns()
    return [(refs[0], key[-1])] if refs and key else []


def _fix(ctx: Context, ops: Table, tasks: Table, link: list[tuple[str, str]], col: str) -> str:
    ended = finals(tasks)
    fn = fixes.name(ctx, ops.name + "_guard_open_task")
    match = " AND ".join(f"t.{tasks.q(tc)} = NEW.{ops.q(oc)}" for oc, tc in link)
    listed = ", ".join("'" + s.replace("'", "''") + "'" for s in ended)
    # Suggested text shown to a DBA; the audit never executes it (S608).
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        "DECLARE\n"
        "  s text;\n"
        "BEGIN\n"
        # Suggested text shown to a DBA; the audit never executes it.
        f"  SELECT t.{tasks.q(col)}::text INTO s FROM {tasks.display} t WHERE {match}\n"
        "    FOR SHARE;  -- a cancel and a reservation serialise on the task row\n"
        f"  IF s IN ({listed}) THEN\n"
        f"    RAISE EXCEPTION '{fixes.said(ops.name)}: task % is %; "
        "nothing more is reserved for it',\n"
        f"      NEW.{ops.q(link[-1][0])}, s USING ERRCODE = 'check_violation';\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(ops.name + '_for_open_task')} AFTER INSERT ON {ops.display} "
        f"FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def check_g20(ctx: Context) -> Finding:
    """G20: a row trigger on the operation table that reads the task table and refuses."""
    ops, tasks = ctx.ops, ctx.tasks
    if ops is None or tasks is None:
        return not_applicable("G20", "no operation table beside a task table: nothing to start")
    state = columns.state(tasks)
    if state is None:
        return not_applicable("G20", f"{tasks.name} has no state column: a task never finishes")
    link = link_to_tasks(ops, tasks)
    if not link:
        return not_applicable("G20", f"{ops.name} does not name its task: nothing to refuse by")
    f = Findings()
    guards = ops.guards_reading([tasks], "insert")
    if guards:
        f.ok(*(f"trigger {g.name}" for g in guards))
    else:
        f.bad(
            f"no trigger on {ops.name} reads {tasks.name} when a row is inserted: an operation "
            f"can be started for a task that was cancelled or has finished, by any writer that "
            "skips the application's check",
            _fix(ctx, ops, tasks, link, state.name),
        )
    return f.finding(
        "G20",
        core_missing=not guards,
        enforced=f"a trigger on {ops.name} refuses an operation for a finished {tasks.name} row",
    )


def finals(tasks: Table) -> list[str]:
    """The task table's final states (declared, else agentdb's)."""
    return [
        s
        for s in fixes.state_values(tasks, columns.state(tasks), "tasks")
        if s.lower() in columns.FINAL_STATES
    ] or ["succeeded", "failed", "cancelled", "dead"]


# A task past its deadline may still be given up, never completed or failed by its
# worker: what its end may be is what says it did not run to the end.
_GIVEN_UP = frozenset({"cancelled", "canceled", "aborted", "dead", "expired", "discarded"})


def check_g21(ctx: Context) -> Finding:
    """G21: a BEFORE UPDATE trigger on tasks that reads the old deadline and refuses."""
    t = ctx.tasks
    if t is None:
        return not_applicable("G21", "no task table: nothing has a deadline")
    deadline = next((c for c in t.columns.values() if _DEADLINE.match(c.name)), None)
    state = columns.state(t)
    if deadline is None or state is None:
        return not_applicable("G21", f"{t.name} has no deadline column: nothing to pass")
    f = Findings()
    guards = t.update_guards(deadline.name)
    if guards:
        f.ok(*(f"trigger {g.name}" for g in guards))
    else:
        dl, col = deadline.qname, state.qname
        ended = finals(t)
        ends = [s for s in ended if s.lower() in _GIVEN_UP] or ["cancelled", "dead"]
        listed = ", ".join("'" + s.replace("'", "''") + "'" for s in ends)
        over = ", ".join("'" + s.replace("'", "''") + "'" for s in ended)
        fn = fixes.name(ctx, t.name + "_guard_deadline")
        f.bad(
            f"no trigger on {t.name} reads the old {deadline.name}: a task past its deadline "
            "can still be claimed, finished or put back to wait by any writer",
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            "BEGIN\n"
            # Every write that leaves it alive - a step, a lease, the deadline itself.
            f"  IF OLD.{dl} <= now() AND NEW.{col}::text NOT IN ({listed}) THEN\n"
            f"    RAISE EXCEPTION '{fixes.said(t.name)}: % passed its deadline; "
            f"it can only end', OLD.{dl}\n"
            "      USING ERRCODE = 'check_violation';\n"
            "  END IF;\n"
            "  RETURN NEW;\n"
            "END $$;\n"
            # Unfinished rows only (a finished task's deadline is history), in the WHEN
            # clause: the function never reads the old state, so it is no state guard.
            f"CREATE TRIGGER {quote(t.name + '_deadline_guard')} BEFORE UPDATE ON {t.display} "
            f"FOR EACH ROW WHEN (OLD.{col}::text NOT IN ({over})) EXECUTE FUNCTION {fn}();",
        )
    return f.finding(
        "G21",
        core_missing=not guards,
        enforced=f"a trigger on {t.name} lets a task past its {deadline.name} only end",
    )
