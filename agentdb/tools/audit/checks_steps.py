"""Check G25: a durable handler's step is recorded once, under the lease that ran it.

What the catalog can show, for a table named like steps or checkpoints that
refers to the task table (where a durable-execution library keeps what each
step of a task returned, to replay it after a crash):

* a unique key on the task reference plus a text column - the step's name:
  a re-entered handler finds the recorded step by name, and a second
  recording of it is refused. Keyed by a counter instead (a step's
  position), an ``if`` that skips a step on one run shifts every later
  step onto another's record - the replay hands back another call's result;
* a row trigger on it that fires on INSERT and reads the task table under a
  row lock: where a step written by a worker whose lease was taken over (or
  for a finished task) is refused. Without it, a stale worker records its
  result beside - or instead of - the current holder's.

Whether each step's arguments are compared with the recorded ones is the
runtime's business; what the schema refuses is reported.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import columns, fixes
from agentdb.tools.audit.catalog import Table, quote
from agentdb.tools.audit.checks_control import link_to_tasks
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g25"]

_STEP_NAME = re.compile(r"(^|_)(steps?|checkpoints?|step_results?|memo)($|_)")
_TEXT = frozenset({"text", "character varying", "varchar", "character", "char", "citext"})
_ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|SHARE|KEY\s+SHARE)\b", re.I)


def _step_table(ctx: Context, tasks: Table) -> Table | None:
    for t in sorted(ctx.cat.tables.values(), key=lambda t: t.name):
        named = _STEP_NAME.search(t.name.lower()) is not None
        if t.oid != tasks.oid and named and columns.task_ref(t, tasks):
            return t
    return None


def _name_key(s: Table, refs: list[str], scope: tuple[str, ...]) -> str | None:
    """A unique key of the task reference plus a text column: the step's name."""
    primary = [(c.name, c.columns, None) for c in s.of("p")]
    for name, cols, predicate in [*primary, *s.unique_keys()]:
        rest = [c for c in cols if c not in refs and c not in scope]
        if (
            predicate is None
            and set(refs) <= set(cols)
            and rest
            and all(c in s.columns and s.columns[c].base in _TEXT for c in rest)
        ):
            return name
    return None


def _guard_fix(ctx: Context, s: Table, tasks: Table, link: list[tuple[str, str]]) -> str:
    fn = fixes.name(ctx, s.name + "_guard")
    match = " AND ".join(f"t.{tasks.q(tc)} = NEW.{s.q(sc)}" for sc, tc in link)
    state = columns.state(tasks)
    read = f"t.{tasks.q(state.name)}::text" if state is not None else "NULL::text"
    # Suggested text shown to a DBA; the audit never executes it (S608).
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        "DECLARE\n"
        "  st text;\n"
        "BEGIN\n"
        f"  SELECT {read} INTO st FROM {tasks.display} t WHERE {match}\n"
        "    FOR SHARE;  -- a take-over or a cancel and a step serialise on the task row\n"
        "  -- Refuse the step unless NEW carries the task's current lease token and the\n"
        "  -- task is still running (compare your lease columns here).\n"
        "  RETURN NEW;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(s.name + '_guard')} BEFORE INSERT OR UPDATE ON {s.display} "
        f"FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def check_g25(ctx: Context) -> Finding:
    """G25: a step table keyed by task and name, whose writes a trigger checks under the lease."""
    tasks = ctx.tasks
    if tasks is None:
        return not_applicable("G25", "no task table: no handler records steps")
    s = _step_table(ctx, tasks)
    if s is None:
        return not_applicable(
            "G25", f"no step or checkpoint table refers to {tasks.name}: no step is replayed"
        )
    link = link_to_tasks(s, tasks)
    refs = [sc for sc, _ in link]
    f = Findings()
    key = _name_key(s, refs, ctx.scope)
    if key is not None:
        f.ok(f"unique key {key}")
    else:
        cols = ", ".join(quote(c) for c in refs)
        add = "" if "name" in s.columns else f"ALTER TABLE {s.display} ADD COLUMN name text;\n"
        f.bad(
            f"no unique key on {s.name} holds the task reference and a step's name: a step "
            "recorded twice, or found by its position, hands a re-entered handler another "
            "call's result",
            f"{add}ALTER TABLE {s.display} ADD CONSTRAINT {quote(s.name + '_name_key')} "
            f"UNIQUE ({cols}, name);",
        )
    guards = [g for g in s.guards_reading([tasks], "insert") if _ROW_LOCK.search(g.source)]
    if guards:
        f.ok(*(f"trigger {g.name}" for g in guards))
    else:
        f.bad(
            f"no trigger on {s.name} reads {tasks.name} under a row lock when a step is "
            "recorded: a worker whose lease was taken over (or a finished task's) still "
            "records one, beside or instead of the current holder's",
            _guard_fix(ctx, s, tasks, link),
        )
    return f.finding(
        "G25",
        core_missing=key is None,
        enforced=f"a unique key on {s.name} records each step of a task once by name, and a "
        f"trigger checks its writer against the {tasks.name} row",
    )
