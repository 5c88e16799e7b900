"""Mutants of the edges of schedules (the catch-up cap exactly, a start on a tick, a
definition changed while firing) and of deadline rules in every non-final state."""

from __future__ import annotations

from dev.mutate.catalogue import MIGRATIONS, Mutant, T, m

SCHEDULES = T + "test_schedules.py"
LATE = T + "test_deadlines.py"
WAITING = LATE + "::test_G21_a_waiting_task_past_its_deadline_only_ends_whatever_it_waits_for"
SWEEP = (
    "    WHERE deadline_at <= now() AND deadline_at IS NOT NULL\n"
    "      AND state IN ('pending', 'waiting', 'running')\n"
)

MUTANTS: tuple[Mutant, ...] = (
    m(
        "edges-cron-start-tick-skipped",
        MIGRATIONS,
        "            RETURN agentdb_cron_tick(p_cron, greatest(p_at, p_anchor - interval "
        "'1 microsecond'), true);",
        "            RETURN agentdb_cron_tick(p_cron, greatest(p_at, p_anchor), true);",
        (SCHEDULES + "::test_G24_a_start_exactly_on_a_cron_tick_fires_that_tick",),
        "agentdb_schedule_tick: a cron schedule whose start falls on a tick never fires that "
        "tick (its first is the one after)",
        within="agentdb_schedule_tick",
    ),
    # The sweep's and the guard's other edges (a waiting task, the deadline's own
    # instant, another tenant's task of the same id, a task another writer holds) are
    # generated mutants - gen-leases-lease_expire_deadlines-*, gen-0006...guard_deadline-*,
    # gen-0013...agent_tasks_deadline_guard-* - which run tests/test_deadlines.py
    # (generate.py's _STATEMENT_TESTS); only what generation cannot write is here.
    m(
        "edges-deadline-guard-lets-a-late-task-wait",
        MIGRATIONS,
        "    IF NEW.state NOT IN ('dead', 'cancelled') THEN",
        "    IF NEW.state NOT IN ('dead', 'cancelled', 'waiting') THEN",
        (LATE + "::test_G21_a_finish_after_the_deadline_is_refused_by_the_database",),
        "agentdb_guard_deadline: the holder of a task past its deadline puts it to wait (for "
        "an approval that can no longer come)",
        within="agentdb_guard_deadline",
    ),
)
