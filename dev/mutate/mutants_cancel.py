"""Mutants of cancellation (G20) and deadlines (G21): the guards, the sweep, the typed
refusals, the worker."""

from __future__ import annotations

from dev.mutate.catalogue import ATTACKS, M_CONTROL_FLOW, MIGRATIONS, Mutant, T, m

TESTS = T + "test_cancel.py"
ATTACK = ATTACKS + "::test_attack_is_refused"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "cancel-guard-lets-cancelled-through",
        MIGRATIONS,
        "    IF task_state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN",
        "    IF task_state IN ('succeeded', 'failed', 'dead') THEN",
        (ATTACK, TESTS),
        "agentdb_guard_open_task: an operation can be reserved for a cancelled task",
        within="agentdb_guard_open_task",
    ),
    m(
        "cancel-guard-reads-without-lock",
        MIGRATIONS,
        "    SELECT t.state, t.deadline_at INTO task_state, task_deadline FROM agent_tasks t\n"
        "    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id\n    FOR SHARE;",
        "    SELECT t.state, t.deadline_at INTO task_state, task_deadline FROM agent_tasks t\n"
        "    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id;",
        (TESTS + "::test_G20_a_raw_reservation_waits_for_a_cancel_in_progress_and_is_refused",),
        "agentdb_guard_open_task: a reservation that read the task before a cancel committed "
        "lands after it",
        within="agentdb_guard_open_task",
    ),
    m(
        "cancel-retry-guard-dropped",
        M_CONTROL_FLOW,
        "    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')\n"
        "    EXECUTE FUNCTION agentdb_guard_open_task();",
        "    FOR EACH ROW WHEN (false)\n    EXECUTE FUNCTION agentdb_guard_open_task();",
        (ATTACK,),
        "agent_operations_for_open_task_retry: a failed operation of a cancelled task is re-armed",
    ),
    m(
        "cancel-told-to-a-stale-holder",
        "agentdb/_explain.py",
        '        ours = now["lease_token"] == lease.token',
        "        ours = True",
        (TESTS + "::test_G20_a_holder_taken_over_before_the_cancel_only_lost_its_lease",),
        "a holder taken over before the cancel is told Cancelled, and writes without a lease",
        within="task_write",
    ),
    m(
        "cancel-keeps-the-lease",
        "agentdb/tasks.py",
        '                to_state="cancelled",',
        '                to_state="running" if task.state == "running" else "cancelled",',
        (TESTS,),
        "tasks.cancel: a running task keeps running under its holder's lease",
        within="cancel",
    ),
    m(
        "cancel-told-as-lease-lost",
        "agentdb/_explain.py",
        '            Cancelled\n            if ours and now["state"] == "cancelled"',
        '            LeaseLost\n            if ours and now["state"] == "cancelled"',
        (TESTS,),
        "the holder of a cancelled task is told its lease was taken over, not why",
        within="task_write",
    ),
    m(
        "cancel-undoes-a-finish",
        "agentdb/tasks.py",
        "        if task.state in FINISHED_STATES:\n            return task\n        try:",
        "        if task.state == 'cancelled':\n            return task\n        try:",
        (TESTS,),
        "tasks.cancel: a finished task is cancelled after the fact",
        within="cancel",
    ),
    m(
        "worker-cancel-not-noticed",
        "agentdb/worker/loop.py",
        "                job.cancelled = isinstance(exc, Cancelled)\n",
        "                job.cancelled = False\n",
        (
            TESTS
            + "::test_G20_a_worker_stops_the_handler_of_a_cancelled_task_and_writes_nothing_more",
        ),
        "the worker counts a cancelled task's stopped handler as a lease taken over",
        within="Worker._heartbeat",
    ),
)

LATE = T + "test_deadlines.py"
MODEL = T + "test_model.py"

MUTANTS += (
    m(
        "deadline-claim-takes-late",
        "agentdb/queries/leases.sql",
        "          -- G21: past its deadline a task is never claimed (the sweep ends it).\n"
        "          AND (t.deadline_at IS NULL OR t.deadline_at > now())\n",
        "",
        (LATE, MODEL),
        "lease_claim: a task past its deadline is offered to a worker",
        within="lease_claim",
    ),
    m(
        "deadline-recovery-takes-late",
        "agentdb/queries/leases.sql",
        "      AND ($4::text[] IS NULL OR task_type = ANY ($4))\n"
        "      AND (deadline_at IS NULL OR deadline_at > now())\n",
        "      AND ($4::text[] IS NULL OR task_type = ANY ($4))\n",
        (LATE + "::test_G21_a_late_task_under_an_expired_lease_is_not_taken_over",),
        "lease_claim: a late task whose holder died is taken over by another worker",
        within="lease_claim",
    ),
    m(
        "deadline-walk-counts-late",
        "agentdb/queries/leases.sql",
        "           WHERE t.state IN ('pending', 'waiting') AND t.attempts < t.max_attempts\n"
        "             AND (t.deadline_at IS NULL OR t.deadline_at > now())\n"
        "             AND t.tenant_id > coalesce(",
        "           WHERE t.state IN ('pending', 'waiting') AND t.attempts < t.max_attempts\n"
        "             AND t.tenant_id > coalesce(",
        (LATE + "::test_G21_a_tenant_whose_due_work_is_all_late_takes_no_turn_of_the_claim",),
        "lease_claim: a tenant whose due work is all late takes a claim's turn and gives nothing",
        within="lease_claim",
    ),
    m(
        "deadline-finish-many-refuses-the-batch",
        "agentdb/queries/tasks.sql",
        "      AND ($6 IN ('dead', 'cancelled') OR t.deadline_at IS NULL OR t.deadline_at > now())\n",
        "",
        (LATE + "::test_G21_a_late_task_in_a_batched_finish_is_refused_alone",),
        "task_finish_many: one late task makes the whole batch fail",
        within="task_finish_many",
    ),
    m(
        "deadline-guard-lets-a-finish-through",
        MIGRATIONS,
        "    IF NEW.state NOT IN ('dead', 'cancelled') THEN",
        "    IF NEW.state NOT IN ('dead', 'cancelled', 'succeeded') THEN",
        (ATTACK, LATE),
        "agentdb_guard_deadline: a task past its deadline can still succeed",
        within="agentdb_guard_deadline",
    ),
    m(
        "deadline-op-guard-ignores-the-deadline",
        MIGRATIONS,
        "    IF task_deadline <= now() THEN",
        "    IF false THEN",
        (ATTACK, LATE, MODEL),
        "agentdb_guard_open_task: a task past its deadline starts a new effect",
        within="agentdb_guard_open_task",
    ),
    m(
        "deadline-sweep-spares-running",
        "agentdb/queries/leases.sql",
        "    WHERE deadline_at <= now() AND deadline_at IS NOT NULL\n"
        "      AND state IN ('pending', 'waiting', 'running')\n",
        "    WHERE deadline_at <= now() AND deadline_at IS NOT NULL\n"
        "      AND state IN ('pending', 'waiting')\n",
        (LATE, MODEL),
        "lease_expire_deadlines: a running task past its deadline keeps its lease",
        within="lease_expire_deadlines",
    ),
    m(
        "deadline-told-as-lease-lost",
        "agentdb/_explain.py",
        '            if ours and now["swept"]',
        "            if False",
        (LATE, MODEL),
        "the holder of a task swept past its deadline is told its lease was taken over",
        within="task_write",
    ),
    m(
        "worker-late-outcome-not-swept",
        "agentdb/worker/finish.py",
        "                await leases.expire_deadlines(self.pool, actor=job.lease.owner)\n",
        "                pass\n",
        (
            LATE
            + "::test_G21_a_handler_that_returns_after_the_deadline_writes_nothing_and_the_task_dies",
        ),
        "worker: a refused late outcome leaves the task running until the next maintenance",
        within="Finisher._record",
    ),
    m(
        "routed-claim-takes-late",
        MIGRATIONS,
        "          AND t.attempts < t.max_attempts AND ($5::text[] IS NULL OR t.task_type = ANY ($5))\n"
        "          AND (t.deadline_at IS NULL OR t.deadline_at > now())\n"
        "          AND (SELECT o.ok FROM open o)",
        "          AND t.attempts < t.max_attempts AND ($5::text[] IS NULL OR t.task_type = ANY ($5))\n"
        "          AND (SELECT o.ok FROM open o)",
        (LATE,),
        "agentdb_routed_claim (Citus): a task past its deadline is offered to a worker",
        citus=True,
        within="agentdb_routed_claim",
    ),
    m(
        "routed-sweep-spares-running",
        "agentdb/_citus/queries/routed.sql",
        "    WHERE t.tenant_id = $1 AND t.deadline_at <= now() AND t.deadline_at IS NOT NULL\n"
        "      AND t.state IN ('pending', 'waiting', 'running')\n",
        "    WHERE t.tenant_id = $1 AND t.deadline_at <= now() AND t.deadline_at IS NOT NULL\n"
        "      AND t.state IN ('pending', 'waiting')\n",
        (LATE,),
        "routed_expire_deadlines (Citus): a running task past its deadline keeps its lease",
        citus=True,
        within="routed_expire_deadlines",
    ),
)
