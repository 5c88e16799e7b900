"""Check G24: a schedule fires once per tick.

What the catalog can show, for a schedule table beside the task table (a
next-run time - ``next_tick_at``, ``next_run_at``, ``next_run``... - and a
rule - ``cron``, ``every``, ``interval``, ``schedule``...):

* a unique key on the task table of a schedule reference and one tick (a
  time, or an epoch number: ``schedule_tick``, ``scheduled_for``,
  ``run_at``...): two schedulers that fire one tick create one task between
  them, whatever order they run in and whatever each believes. A scheduler
  that asks "already fired?" before it inserts - or that trusts a lock, or
  ``next_run_at`` it read a moment ago - fires twice when two of them (or one
  restarted) ask at once;
* a row trigger on the task table that fires on INSERT, reads the schedule
  table and can refuse: a tick of no schedule of the task's tenant, or one
  in the future or off the rule (a skewed clock's 12:00:00.5 beside
  12:00:00 is another key);
* a trigger that refuses a change of a task's schedule or tick before an
  UPDATE: a tick moved away is free to fire again.

When a scheduler runs, how it catches up after downtime and whether a
paused schedule fires are the application's; what the schema refuses is
what is reported.
"""

from __future__ import annotations

import re
from typing import Final

from agentdb.tools.audit import fixes
from agentdb.tools.audit.catalog import Column, Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g24"]

_NEXT = re.compile(
    r"^(?:next_(?:tick|run|fire|firing|execution|exec|due|occurrence|trigger|invocation)"
    r"(?:_at|_time|_on|_ts)?|next_at)$"
)
_RULE = re.compile(
    r"^(?:cron|cron_expr(?:ession)?|cron_spec|cron_schedule|crontab|schedule|"
    r"schedule_expr(?:ession)?|rrule|every|run_every|repeat_every|interval|repeat_interval|"
    r"interval_(?:seconds|secs|ms|millis)|period|period_(?:seconds|secs|ms)|frequency)$"
)
_REF = re.compile(
    r"^(?:schedule|schedule_(?:id|uuid|key|name)|cron_(?:id|job_id)|crontab_id|"
    r"periodic_(?:id|task_id)|recurrence_id|recurring_(?:id|job_id|task_id))$"
)
_TICK = re.compile(
    r"^(?:schedule_tick|tick|tick_at|scheduled_for|scheduled_at|scheduled_time|fire_at|"
    r"fired_for|run_for|occurrence_at)$"
)
_ANCHOR = re.compile(r"^(?:anchor|anchor_at|anchored_at|starts_at|start_at|start_time|epoch)$")
_TIME: Final = frozenset({"timestamptz", "timestamp"})
_NUMBER: Final = frozenset({"smallint", "integer", "bigint", "int2", "int4", "int8", "numeric"})


def _schedule_table(ctx: Context, tasks: Table) -> Table | None:
    """A table (not the task table) with a next-run time and a rule."""
    for t in sorted(ctx.cat.tables.values(), key=lambda t: t.name):
        cols = t.columns.values()
        timed = any(_NEXT.match(c.name) and c.base in _TIME | _NUMBER for c in cols)
        if t.oid != tasks.oid and timed and any(_RULE.match(c.name) for c in cols):
            return t
    return None


def _link(ctx: Context, tasks: Table, s: Table) -> list[tuple[str, str]]:
    """(task column, schedule column) pairs naming a task's schedule: a foreign key,
    else a ``schedule_id``-like column beside the tenant column."""
    for fk in tasks.of("f"):
        if fk.ref_oid == s.oid:
            return list(zip(fk.columns, fk.ref_columns, strict=True))
    singular = s.name.removesuffix("s")
    names = {f"{singular}_id", f"{singular.rsplit('_', 1)[-1]}_id"}
    ref = next(
        (c.name for c in tasks.columns.values() if _REF.match(c.name) or c.name in names), None
    )
    if ref is None:
        return []
    key = [c for c in s.pk_columns() if c not in ctx.scope] or (["id"] if "id" in s.columns else [])
    if not key:
        return []
    scope = [(c, c) for c in ctx.scope if c in tasks.columns and c in s.columns]
    return [*scope, (ref, key[-1])]


def _tick_key(tasks: Table, refs: list[str], scope: tuple[str, ...]) -> tuple[str, str] | None:
    """(unique key, tick column): a key of the schedule reference plus one time or number."""
    if not refs:
        return None
    for name, cols, predicate in tasks.unique_keys():
        rest = [c for c in cols if c not in refs and c not in scope]
        if (
            _only_not_null(predicate)
            and set(refs) <= set(cols)
            and len(rest) == 1
            and rest[0] in tasks.columns
            and tasks.columns[rest[0]].base in _TIME | _NUMBER
        ):
            return name, rest[0]
    return None


def _only_not_null(predicate: str | None) -> bool:
    """No predicate, or one that only leaves out rows with no schedule (``IS NOT NULL``)."""
    if predicate is None:
        return True
    parts = re.split(r"\s+AND\s+", predicate.strip("() "), flags=re.IGNORECASE)
    return all(re.fullmatch(r"\(*[\w\"]+\s+IS\s+NOT\s+NULL\)*", p.strip()) for p in parts)


def _tick_column(tasks: Table) -> Column | None:
    return next(
        (c for c in tasks.columns.values() if _TICK.match(c.name) and c.base in _TIME | _NUMBER),
        None,
    )


def _key_fix(ctx: Context, tasks: Table, s: Table, ref: str | None, tick: str) -> str:
    add: list[str] = []
    if ref is None:
        key = [c for c in s.pk_columns() if c not in ctx.scope] or ["id"]
        kind = s.columns[key[-1]].type if key[-1] in s.columns else "uuid"
        ref = "schedule_id"
        add.append(f"ADD COLUMN {ref} {kind}")
    if tick not in tasks.columns:
        add.append(f"ADD COLUMN {quote(tick)} timestamptz")
    cols = ", ".join(tasks.q(c) for c in (*ctx.scope, ref, tick))
    out = [f"ALTER TABLE {tasks.display} {', '.join(add)};"] if add else []
    out.append(
        f"ALTER TABLE {tasks.display} ADD CONSTRAINT {quote(tasks.name + '_schedule_tick_key')} "
        f"UNIQUE ({cols});  -- the scheduler inserts ON CONFLICT DO NOTHING"
    )
    return "\n".join(out)


def _guard_fix(
    ctx: Context, tasks: Table, s: Table, link: list[tuple[str, str]], ref: str, tick: str
) -> str:
    fn = fixes.name(ctx, tasks.name + "_guard_schedule_tick")
    match = " AND ".join(f"k.{s.q(sc)} = NEW.{tasks.q(tc)}" for tc, sc in link)
    qt = tasks.q(tick)
    timed = tick not in tasks.columns or tasks.columns[tick].base in _TIME
    off: list[str] = []
    if timed:
        off.append(f"NEW.{qt} > now()")
        every = next(
            (c for c in s.columns.values() if _RULE.match(c.name) and c.base == "interval"), None
        )
        anchor = next(
            (c for c in s.columns.values() if _ANCHOR.match(c.name) and c.base in _TIME), None
        )
        if every is not None and anchor is not None:
            e, a = f"sch.{every.qname}", f"sch.{anchor.qname}"
            off.append(
                f"({e} IS NOT NULL AND (NEW.{qt} < {a} OR mod(extract(epoch FROM NEW.{qt} - {a}), "
                f"extract(epoch FROM {e})) <> 0))"
            )
    refuse = " OR ".join(["NOT FOUND", *off])
    # Suggested text shown to a DBA; the audit never executes it (S608).
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        "DECLARE\n"
        "  sch record;\n"
        "BEGIN\n"
        f"  SELECT * INTO sch FROM {s.display} k WHERE {match};\n"
        f"  IF {refuse} THEN  -- a rule kept as cron: check the tick against it too\n"
        f"    RAISE EXCEPTION '{fixes.said(tasks.name)}: % is not a due tick of "
        f"schedule %', NEW.{qt},\n"
        f"      NEW.{tasks.q(ref)} USING ERRCODE = 'check_violation';\n"
        "  END IF;\n"
        "  RETURN NEW;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(tasks.name + '_schedule_guard')} BEFORE INSERT ON "
        f"{tasks.display} FOR EACH ROW WHEN (NEW.{tasks.q(ref)} IS NOT NULL) "
        f"EXECUTE FUNCTION {fn}();"
    )


def _fixed_fix(ctx: Context, tasks: Table, ref: str, tick: str) -> str:
    fn = fixes.name(ctx, tasks.name + "_keep_schedule_tick")
    r, k = tasks.q(ref), tasks.q(tick)
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        f"  RAISE EXCEPTION '{fixes.said(tasks.name)}: a task is tick % of schedule %; "
        "that never changes',\n"
        f"    OLD.{k}, OLD.{r} USING ERRCODE = 'check_violation';\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(tasks.name + '_schedule_fixed')} BEFORE UPDATE OF {r}, {k} ON "
        f"{tasks.display} FOR EACH ROW WHEN (NEW.{r} IS DISTINCT FROM OLD.{r} "
        f"OR NEW.{k} IS DISTINCT FROM OLD.{k}) EXECUTE FUNCTION {fn}();"
    )


def check_g24(ctx: Context) -> Finding:
    """G24: a unique key on tasks of a schedule reference and its tick; a tick guard."""
    tasks = ctx.tasks
    if tasks is None:
        return not_applicable("G24", "no task table: nothing is scheduled")
    s = _schedule_table(ctx, tasks)
    if s is None:
        return not_applicable(
            "G24", "no schedule table (a next-run time beside a cron or interval rule): "
            "nothing recurs"
        )  # fmt: skip
    link = _link(ctx, tasks, s)
    refs = [tc for tc, _ in link if tc not in ctx.scope]
    f = Findings()
    found = _tick_key(tasks, refs, ctx.scope)
    if found is not None:
        key, tick = found
        f.ok(f"unique key {key}")
    else:
        named = _tick_column(tasks)
        tick = named.name if named is not None else "schedule_tick"
        what = (
            f"{tasks.name}.{refs[-1]} and a tick" if refs else f"a reference to {s.name} and a tick"
        )
        f.bad(
            f"no unique key on {tasks.name} holds {what}: a scheduler that checks whether a "
            f"tick of {s.name} has fired before it inserts fires it twice when two schedulers "
            "(or one restarted) fire at once",
            _key_fix(ctx, tasks, s, refs[-1] if refs else None, tick),
        )
    ref = refs[-1] if refs else "schedule_id"
    link = link or [
        *((c, c) for c in ctx.scope if c in s.columns),
        (ref, ([c for c in s.pk_columns() if c not in ctx.scope] or ["id"])[-1]),
    ]
    guards = [g for g in tasks.guards_reading([s], "insert") if not refs or g.mentions(ref)]
    if guards:
        f.ok(*(f"trigger {g.name}" for g in guards))
    else:
        f.bad(
            f"no trigger on {tasks.name} reads {s.name} when a task is inserted: a task can "
            "claim a tick that is not one of its schedule's - in the future, off the rule, or "
            "of another tenant's schedule - and a skewed clock's tick is a second key",
            _guard_fix(ctx, tasks, s, link, ref, tick),
        )
    fixed = [*tasks.update_guards(tick), *tasks.update_guards(ref)]
    if fixed:
        f.ok(*(f"trigger {g.name}" for g in fixed))
    else:
        f.bad(
            f"nothing refuses a change of a task's {ref} or {tick} on {tasks.name}: a tick "
            "moved away is free to fire again",
            _fixed_fix(ctx, tasks, ref, tick),
        )
    return f.finding(
        "G24",
        core_missing=found is None,
        enforced=f"a unique key on {tasks.name} lets one task per tick of {s.name} in, and "
        "triggers check each tick against its schedule and keep it",
    )
