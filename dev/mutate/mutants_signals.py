"""Mutants of signals and approvals (G22) - the order, the wake-up, the cursor, the refusals,
the agent's policy, the worker's read - and of child tasks (G23): the fan-in, its lock,
the late wait, the refusals, retention."""

from __future__ import annotations

from dev.mutate.catalogue import (
    ATTACKS,
    M_ACCESS,
    M_CONTROL_FLOW,
    M_RETENTION,
    M_TASKS,
    Mutant,
    T,
    m,
)

KIDS = T + "test_children.py"
TESTS = T + "test_signals.py"
MODEL = T + "test_model.py"
ATTACK = ATTACKS + "::test_attack_is_refused"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "signal-guard-without-lock",
        M_CONTROL_FLOW,
        "    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id\n    FOR NO KEY UPDATE;",
        "    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id;",
        (
            TESTS + "::test_G22_concurrent_senders_get_one_place_each_in_the_tasks_order",
            TESTS + "::test_G22_a_wait_committing_while_the_signal_waits_for_its_lock_is_woken",
        ),
        "agentdb_guard_signal: senders to one task do not serialise (two take one seq, or a "
        "signal misses the wait committing beside it)",
    ),
    m(
        "signal-to-a-finished-task",
        M_CONTROL_FLOW,
        "    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN",
        "    IF task.state IN ('succeeded', 'failed', 'dead') THEN",
        (ATTACK, TESTS, MODEL),
        "agentdb_guard_signal: a cancelled task takes signals",
    ),
    m(
        "signal-to-a-late-task",
        M_CONTROL_FLOW,
        "    IF task.deadline_at <= now() THEN",
        "    IF task.deadline_at <= now() - interval '1000 years' THEN",
        (ATTACK, TESTS),
        "agentdb_guard_signal: a task past its deadline takes signals",
    ),
    m(
        "signal-self-approval",
        M_CONTROL_FLOW,
        "    IF NEW.kind = 'approval' AND (NEW.sender = task.lease_owner\n",
        "    IF NEW.kind = 'approval' AND false AND (NEW.sender = task.lease_owner\n",
        (ATTACK, TESTS),
        "agentdb_guard_signal: the task's lease holder approves its own work",
    ),
    m(
        "signal-seq-from-the-insert",
        M_CONTROL_FLOW,
        "    NEW.seq := 1 + coalesce(",
        "    NEW.seq := coalesce(NEW.seq, 1) + 0 * coalesce(",
        (TESTS, MODEL),
        "agentdb_guard_signal: a signal's place comes from the INSERT, not the task's order",
    ),
    m(
        "signal-wakes-nobody",
        M_CONTROL_FLOW,
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name",
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name AND false",
        (TESTS, MODEL),
        "agentdb_deliver_signal: a task waiting for the signal sleeps on",
    ),
    m(
        "signal-wakes-any-waiter",
        M_CONTROL_FLOW,
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name",
        "      AND k.state = 'waiting'",
        (TESTS + "::test_G22_a_waiting_task_is_woken_by_its_signal_and_not_by_another", MODEL),
        "agentdb_deliver_signal: a signal of another name wakes the task",
    ),
    m(
        "signal-unaudited",
        M_CONTROL_FLOW,
        "           CASE WHEN NEW.kind = 'approval' THEN 'task.' || NEW.decision ELSE "
        "'task.signalled' END,",
        "           CASE WHEN NEW.kind = 'approval' THEN 'task.' || NEW.decision ELSE "
        "'task.signal' END,",
        (TESTS, MODEL),
        "agentdb_deliver_signal: a signal's event is not the one the audit trail promises",
    ),
    m(
        "signal-lost-before-the-wait",
        M_CONTROL_FLOW,
        "                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal) THEN",
        "                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal"
        " AND false) THEN",
        (
            TESTS + "::test_G22_a_signal_sent_before_the_wait_makes_the_wait_due_at_once",
            TESTS + "::test_G22_a_signal_committing_while_the_wait_waits_for_its_lock_wakes_it",
            MODEL,
        ),
        "agentdb_guard_signal_cursor: a signal that arrived before the wait never wakes it",
    ),
    m(
        "signal-cursor-moves-back",
        M_CONTROL_FLOW,
        "    IF NEW.signal_cursor < OLD.signal_cursor THEN",
        "    IF NEW.signal_cursor < OLD.signal_cursor AND false THEN",
        (ATTACK, TESTS),
        "agentdb_guard_signal_cursor: the cursor goes back - a signal read is read again",
    ),
    m(
        "signal-cursor-past-the-end",
        M_CONTROL_FLOW,
        "    IF NEW.signal_cursor > OLD.signal_cursor\n       AND NOT EXISTS",
        "    IF NEW.signal_cursor > OLD.signal_cursor + 1000000\n       AND NOT EXISTS",
        (ATTACK, TESTS),
        "agentdb_guard_signal_cursor: the cursor skips past signals not yet sent",
    ),
    m(
        "signal-changed",
        M_CONTROL_FLOW,
        "    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_signal_immutable();",
        "    FOR EACH ROW WHEN (false) EXECUTE FUNCTION agentdb_guard_signal_immutable();",
        (ATTACK,),
        "agent_signals_immutable: a recorded signal is rewritten",
    ),
    m(
        "signal-agent-approves",
        M_ACCESS,
        "            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');",
        "            WITH CHECK (tenant_id = agentdb_current_tenant());",
        (T + "test_access.py",),
        "agent_signals_agent_send: the agent role approves (its own work)",
    ),
    m(
        "signal-agent-any-tenant",
        M_ACCESS,
        "            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');",
        "            WITH CHECK (kind = 'signal');",
        (T + "test_access.py",),
        "agent_signals_agent_send: the agent role signals another tenant's task",
        equivalent="agent_signals_access refuses it first: the agent sees no other "
        "tenant's task (agent_tasks_agent_scope), so no INSERT reaches this second wall",
    ),
    m(
        "signal-wait-forgets-what-it-read",
        "agentdb/worker/finish.py",
        "                    signals_read=job.signals_read if outcome.signal is not None else None,",
        "                    signals_read=None,",
        (TESTS + "::test_G22_a_worker_handler_waits_for_approval_and_reads_each_signal_once",),
        "the worker's Wait does not move the cursor: the handler reads the same signals again",
    ),
    m(
        "signal-replay-refused-after-finish",
        "agentdb/signals.py",
        "        if dedupe_key is not None:\n            row = await _db.fetch_optional(",
        "        if False:\n            row = await _db.fetch_optional(",
        (TESTS, MODEL),
        "signals.signal: a replayed key is refused once the task finished, not answered",
    ),
    m(
        "signal-replay-ignores-payload",
        "agentdb/signals.py",
        "            if found.input_hash != digest:",
        "            if False:",
        (TESTS + "::test_G22_a_signal_is_recorded_once_per_key_with_its_event",),
        "signals.signal: a different payload under a used key is answered, not refused (G4)",
    ),
    m(
        "fan-in-without-lock",
        M_CONTROL_FLOW,
        "    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id\n    FOR NO KEY UPDATE;",
        "    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id;",
        (KIDS + "::test_G23_the_last_of_many_concurrent_finishes_wakes_the_parent_once",),
        "agentdb_fan_in: children finishing at once count without taking turns - none sees "
        "the last finish, the parent sleeps on",
    ),
    m(
        "fan-in-wakes-early",
        M_CONTROL_FLOW,
        "    IF agentdb_children_done(NEW.tenant_id, NEW.parent_id) < parent.wait_children THEN",
        "    IF agentdb_children_done(NEW.tenant_id, NEW.parent_id) < 1 THEN",
        (KIDS,),
        "agentdb_fan_in: the first finished child wakes the parent",
    ),
    m(
        "children-done-counts-unfinished",
        M_CONTROL_FLOW,
        "      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead');",
        "      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead', 'running', 'pending');",
        (KIDS,),
        "agentdb_children_done: children still running count as done, so the parent wakes early",
    ),
    m(
        "fan-in-wakes-twice",
        M_CONTROL_FLOW,
        "    SET state = 'pending', state_version = p.state_version + 1, wake_at = now(),\n"
        "        wait_children = NULL, updated_at = now()",
        "    SET state = 'waiting', state_version = p.state_version + 1, wake_at = now(),\n"
        "        updated_at = now()",
        (KIDS,),
        "agentdb_fan_in: the wake leaves the parent waiting for children, so each later "
        "finish wakes it again",
    ),
    m(
        "fan-in-never",
        M_CONTROL_FLOW,
        "    AFTER UPDATE OF state ON agent_tasks\n    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL",
        "    AFTER UPDATE OF state ON agent_tasks\n    FOR EACH ROW WHEN (false AND NEW.parent_id IS NOT NULL",
        (KIDS,),
        "agent_tasks_fan_in: no child's finish wakes its parent",
    ),
    m(
        "children-late-wait-lost",
        M_CONTROL_FLOW,
        "        IF agentdb_children_done(NEW.tenant_id, NEW.id) >= NEW.wait_children THEN",
        "        IF false THEN",
        (KIDS + "::test_G23_a_wait_that_begins_after_the_children_finished_is_due_at_once",),
        "agentdb_guard_children_wait: a wait for children that already finished sleeps for ever",
    ),
    m(
        "child-of-a-finished-parent",
        M_CONTROL_FLOW,
        "    IF parent.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN",
        "    IF parent.state IN ('succeeded', 'failed', 'dead') THEN",
        (ATTACK, KIDS),
        "agentdb_guard_child: a cancelled parent takes new children",
    ),
    m(
        "purge-takes-a-parent",
        M_RETENTION,
        "                 AND NOT EXISTS (SELECT 1 FROM agent_tasks c\n"
        "                                 WHERE c.tenant_id = k.tenant_id AND c.parent_id = k.id)",
        "",
        (KIDS + "::test_G23_retention_keeps_a_parent_while_its_children_stay",),
        "agentdb_purge_tasks: the purge picks a parent whose child stays, and fails on it",
    ),
    m(
        "signal-past-holder-approves",
        M_CONTROL_FLOW,
        "                     AND e.actor_id = NEW.sender)) THEN",
        "                     AND e.actor_id = NEW.sender AND false)) THEN",
        (TESTS + "::test_G22_a_past_holder_cannot_approve_the_work_it_did",),
        "agentdb_guard_signal: a holder that waited (its lease released) approves its own work",
    ),
    m(
        "signal-any-isolation",
        M_CONTROL_FLOW,
        "    PERFORM agentdb_require_read_committed('AG015', TG_NAME, TG_TABLE_NAME);\n"
        "    SELECT k.state",
        "    SELECT k.state",
        (ATTACK,),
        "agentdb_guard_signal: a signal at REPEATABLE READ takes its place from a stale snapshot",
    ),
    m(
        "signal-wait-any-isolation",
        M_CONTROL_FLOW,
        "        ELSE\n            PERFORM agentdb_require_read_committed('AG015'",
        "        ELSE\n            PERFORM coalesce('AG015'",
        (ATTACK,),
        "agentdb_guard_signal_cursor: a wait at REPEATABLE READ sleeps on a signal it cannot see",
    ),
    m(
        "fan-in-any-isolation",
        M_CONTROL_FLOW,
        "    PERFORM agentdb_require_read_committed('AG016', TG_NAME, TG_TABLE_NAME);\n"
        "    IF agentdb_children_done",
        "    IF agentdb_children_done",
        (ATTACK,),
        "agentdb_fan_in: two children finishing at REPEATABLE READ each count the other as open",
    ),
    m(
        "children-wait-any-isolation",
        M_CONTROL_FLOW,
        "        ELSE\n            PERFORM agentdb_require_read_committed('AG016'",
        "        ELSE\n            PERFORM coalesce('AG016'",
        (ATTACK,),
        "agentdb_guard_children_wait: a wait at REPEATABLE READ sleeps on a count it cannot trust",
    ),
    m(
        "isolation-check-admits-repeatable-read",
        M_CONTROL_FLOW,
        "NOT IN ('read committed', 'read uncommitted') THEN",
        "NOT IN ('read committed', 'read uncommitted', 'repeatable read') THEN",
        (ATTACK,),
        "agentdb_require_read_committed: REPEATABLE READ passes",
    ),
    m(
        "signal-access-told",
        M_CONTROL_FLOW,
        "    FOR EACH ROW EXECUTE FUNCTION agentdb_signal_access();",
        "    FOR EACH ROW WHEN (false) EXECUTE FUNCTION agentdb_signal_access();",
        (
            T
            + "test_access.py::test_G22_an_agent_learns_nothing_of_another_tenants_task_by_signalling_it",
        ),
        "agent_signals_access: the owner's guard tells an agent another tenant's task is finished",
    ),
    m(
        "child-of-a-late-parent",
        M_CONTROL_FLOW,
        "    IF parent.deadline_at <= now() THEN",
        "    IF parent.deadline_at <= now() - interval '1000 years' THEN",
        (ATTACK, KIDS),
        "agentdb_guard_child: a parent past its deadline takes new children",
    ),
    m(
        "child-key-squatted",
        M_TASKS,
        "               OR (parent_id IS NOT NULL AND child_key IS NOT NULL\n"
        "                   AND dedupe_key = 'child/' || parent_id::text || '/' || child_key)),",
        "               OR true),",
        (ATTACK, KIDS),
        "agent_tasks_child_dedupe_reserved: any task takes a child's dedupe key first",
    ),
    m(
        "purge-signals-unbounded",
        M_RETENTION,
        "               LIMIT p_batch) v\n        WHERE s.tenant_id = v.tenant_id AND s.id = v.id;",
        "               ) v\n        WHERE s.tenant_id = v.tenant_id AND s.id = v.id;",
        (TESTS + "::test_G22_a_tenants_signals_go_with_its_deletion_and_a_purged_task",),
        "agentdb_purge_task_signals: one statement takes every purgeable signal, not a batch",
    ),
    m(
        "purge-takes-a-signalled-task",
        M_RETENTION,
        "                 AND NOT EXISTS (SELECT 1 FROM agent_signals s\n"
        "                                 WHERE s.tenant_id = k.tenant_id AND s.task_id = k.id)\n",
        "",
        (TESTS + "::test_G22_a_tenants_signals_go_with_its_deletion_and_a_purged_task",),
        "agentdb_purge_tasks: the purge picks a task whose signals stay, and fails on it",
    ),
    m(
        "worker-waits-for-no-children",
        "agentdb/worker/finish.py",
        "                    wait_children=want,",
        "                    wait_children=None,",
        (KIDS + "::test_G23_a_worker_fans_out_and_is_woken_by_the_last_child",),
        "the worker's Wait(children=...) sleeps without waiting for its children",
    ),
)
