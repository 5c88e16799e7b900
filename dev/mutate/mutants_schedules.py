"""Mutants of schedules (G24): the tick key, the tick guard, the firing's lock, catch-up,
pause and resume, and the cron and interval arithmetic."""

from __future__ import annotations

from dev.mutate.catalogue import ATTACKS, M_PARTIAL_KEYS, M_SCHEDULES, Mutant, T, m

TESTS = T + "test_schedules.py"
ATTACK = ATTACKS + "::test_attack_is_refused"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "schedule-tick-not-unique",
        M_PARTIAL_KEYS,
        "    ON agent_tasks (tenant_id, schedule_id, schedule_tick)\n",
        "    ON agent_tasks (tenant_id, schedule_id, schedule_tick, id)\n",
        (ATTACK, TESTS + "::test_G24_schedulers_racing_on_one_tick_create_one_task"),
        "agent_tasks_schedule_tick_key: two tasks for one tick of a schedule",
    ),
    m(
        "schedule-fire-without-lock",
        M_PARTIAL_KEYS,
        "    WHERE k.tenant_id = p_tenant AND k.id = p_schedule\n    FOR UPDATE SKIP LOCKED;",
        "    WHERE k.tenant_id = p_tenant AND k.id = p_schedule;",
        (TESTS + "::test_G24_schedulers_racing_on_one_tick_create_one_task",),
        "agentdb_fire_schedule: a scheduler fires a schedule another one holds",
    ),
    m(
        "schedule-any-tick",
        M_SCHEDULES,
        "       OR NOT agentdb_schedule_is_tick(s.every, s.cron, s.anchor, NEW.schedule_tick) THEN",
        "       OR false THEN",
        (ATTACK,),
        "agentdb_guard_schedule_tick: a task for an instant that is no tick of its schedule",
    ),
    m(
        "schedule-future-tick",
        M_SCHEDULES,
        "    IF NOT FOUND OR NEW.schedule_tick > now()",
        "    IF NOT FOUND OR NEW.schedule_tick > now() + interval '1000 years'",
        (ATTACK,),
        "agentdb_guard_schedule_tick: a task for a tick still to come",
    ),
    m(
        "schedule-of-another-tenant",
        M_SCHEDULES,
        "    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.schedule_id;",
        "    WHERE k.id = NEW.schedule_id;",
        (ATTACK,),
        "agentdb_guard_schedule_tick: a task made for another tenant's schedule",
    ),
    m(
        "schedule-tick-rewritten",
        M_SCHEDULES,
        "    FOR EACH ROW WHEN (NEW.schedule_id IS DISTINCT FROM OLD.schedule_id\n"
        "                       OR NEW.schedule_tick",
        "    FOR EACH ROW WHEN (false AND (NEW.schedule_id IS DISTINCT FROM OLD.schedule_id\n"
        "                       OR NEW.schedule_tick) AND NEW.schedule_tick",
        (ATTACK,),
        "agent_tasks_schedule_fixed: a task's tick is moved, freeing the old one to fire again",
    ),
    m(
        "schedule-paused-fires",
        M_PARTIAL_KEYS,
        "    IF NOT FOUND OR s.paused OR s.next_tick_at > now() THEN",
        "    IF NOT FOUND OR s.next_tick_at > now() THEN",
        (TESTS + "::test_G24_a_paused_schedule_fires_nothing_and_never_fires_its_paused_ticks",),
        "agentdb_fire_schedule: a paused schedule fires",
    ),
    m(
        "schedule-latest-fires-all",
        M_PARTIAL_KEYS,
        "    IF s.catch_up = 'latest' THEN",
        "    IF s.catch_up = 'never' THEN",
        (TESTS + "::test_G24_the_latest_policy_fires_one_task_and_says_what_it_skipped",),
        "agentdb_fire_schedule: catch_up 'latest' fires every missed tick",
    ),
    m(
        "schedule-next-tick-stays",
        M_PARTIAL_KEYS,
        "    SET next_tick_at = agentdb_schedule_tick(s.every, s.cron, s.anchor, t, true),",
        "    SET next_tick_at = s.next_tick_at,",
        (TESTS + "::test_G24_an_interval_schedule_catches_up_every_missed_tick_once",),
        "agentdb_fire_schedule: next_tick_at does not move past what fired",
    ),
    m(
        "schedule-resume-fires-the-pause",
        M_SCHEDULES,
        "        next_tick_at = CASE WHEN p_paused OR k.next_tick_at > at THEN k.next_tick_at",
        "        next_tick_at = CASE WHEN true THEN k.next_tick_at",
        (TESTS + "::test_G24_a_paused_schedule_fires_nothing_and_never_fires_its_paused_ticks",),
        "agentdb_pause_schedule: a resumed schedule fires the ticks of its pause",
    ),
    m(
        "cron-days-and",
        M_SCHEDULES,
        "    either boolean := left(f[3], 1) <> '*' AND left(f[5], 1) <> '*';",
        "    either boolean := false;",
        (TESTS + "::test_G24_cron_ticks_agree_with_a_brute_force_reading",),
        "agentdb_cron_tick: a restricted day-of-month and day-of-week must both match",
    ),
    m(
        "cron-step-ignored",
        M_SCHEDULES,
        "        step := coalesce(m[6]::integer, 1);",
        "        step := 1;",
        (TESTS + "::test_G24_a_cron_schedule_fires_on_its_minutes_in_utc",),
        "agentdb_cron_field: '*/3' fires every minute",
    ),
    m(
        "interval-tick-skips-one",
        M_SCHEDULES,
        "         + CASE WHEN p_forward THEN 1 ELSE 0 END;",
        "         + CASE WHEN p_forward THEN 2 ELSE 0 END;",
        (TESTS + "::test_G24_an_interval_schedule_catches_up_every_missed_tick_once",),
        "agentdb_schedule_tick: the next interval tick is one too far",
    ),
    m(
        "schedule-refusal-stops-the-rest",
        "agentdb/schedules.py",
        "        except InvariantViolation as exc:",
        "        except ZeroDivisionError as exc:",
        (TESTS + "::test_G24_a_schedule_whose_task_is_refused_does_not_hold_up_the_others",),
        "schedules.fire_due: one refused schedule stops every schedule due after it",
    ),
    m(
        "worker-fires-no-schedules",
        "agentdb/worker/loop.py",
        "            fired = await schedules.fire_due(self.pool)",
        "            fired: list[object] = []",
        (TESTS + "::test_G24_a_worker_fires_due_schedules_as_it_sweeps",),
        "the worker's sweep fires no schedule",
    ),
)
