"""Mutants of signals and approvals (G22): the order, the wake-up, the cursor, the refusals,
the agent's policy, the worker's read."""

from __future__ import annotations

from agentdb.tools.mutate.catalogue import ATTACKS, Mutant, T, m

SIGNALS = "sql/0020.signals.sql"
TESTS = T + "test_signals.py"
MODEL = T + "test_model.py"
ATTACK = ATTACKS + "::test_attack_is_refused"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "signal-guard-without-lock",
        SIGNALS,
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
        SIGNALS,
        "    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN",
        "    IF task.state IN ('succeeded', 'failed', 'dead') THEN",
        (ATTACK, TESTS, MODEL),
        "agentdb_guard_signal: a cancelled task takes signals",
    ),
    m(
        "signal-to-a-late-task",
        SIGNALS,
        "    IF task.deadline_at <= now() THEN",
        "    IF task.deadline_at <= now() - interval '1000 years' THEN",
        (ATTACK, TESTS),
        "agentdb_guard_signal: a task past its deadline takes signals",
    ),
    m(
        "signal-self-approval",
        SIGNALS,
        "    IF NEW.kind = 'approval' AND NEW.sender = task.lease_owner THEN",
        "    IF NEW.kind = 'approval' AND NEW.sender = task.lease_owner AND false THEN",
        (ATTACK, TESTS),
        "agentdb_guard_signal: the task's lease holder approves its own work",
    ),
    m(
        "signal-seq-from-the-insert",
        SIGNALS,
        "    NEW.seq := 1 + coalesce(",
        "    NEW.seq := coalesce(NEW.seq, 1) + 0 * coalesce(",
        (TESTS, MODEL),
        "agentdb_guard_signal: a signal's place comes from the INSERT, not the task's order",
    ),
    m(
        "signal-wakes-nobody",
        SIGNALS,
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name",
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name AND false",
        (TESTS, MODEL),
        "agentdb_deliver_signal: a task waiting for the signal sleeps on",
    ),
    m(
        "signal-wakes-any-waiter",
        SIGNALS,
        "      AND k.state = 'waiting' AND k.wait_signal = NEW.name",
        "      AND k.state = 'waiting'",
        (TESTS + "::test_G22_a_waiting_task_is_woken_by_its_signal_and_not_by_another", MODEL),
        "agentdb_deliver_signal: a signal of another name wakes the task",
    ),
    m(
        "signal-unaudited",
        SIGNALS,
        "           CASE WHEN NEW.kind = 'approval' THEN 'task.' || NEW.decision ELSE "
        "'task.signalled' END,",
        "           CASE WHEN NEW.kind = 'approval' THEN 'task.' || NEW.decision ELSE "
        "'task.signal' END,",
        (TESTS, MODEL),
        "agentdb_deliver_signal: a signal's event is not the one the audit trail promises",
    ),
    m(
        "signal-lost-before-the-wait",
        SIGNALS,
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
        SIGNALS,
        "    IF NEW.signal_cursor < OLD.signal_cursor THEN",
        "    IF NEW.signal_cursor < OLD.signal_cursor AND false THEN",
        (ATTACK, TESTS),
        "agentdb_guard_signal_cursor: the cursor goes back - a signal read is read again",
    ),
    m(
        "signal-cursor-past-the-end",
        SIGNALS,
        "    IF NEW.signal_cursor > OLD.signal_cursor\n       AND NOT EXISTS",
        "    IF NEW.signal_cursor > OLD.signal_cursor + 1000000\n       AND NOT EXISTS",
        (ATTACK, TESTS),
        "agentdb_guard_signal_cursor: the cursor skips past signals not yet sent",
    ),
    m(
        "signal-changed",
        SIGNALS,
        "    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_signal_immutable();",
        "    FOR EACH ROW WHEN (false) EXECUTE FUNCTION agentdb_guard_signal_immutable();",
        (ATTACK,),
        "agent_signals_immutable: a recorded signal is rewritten",
    ),
    m(
        "signal-agent-approves",
        SIGNALS,
        "            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');",
        "            WITH CHECK (tenant_id = agentdb_current_tenant());",
        (T + "test_access.py",),
        "agent_signals_agent_send: the agent role approves (its own work)",
    ),
    m(
        "signal-agent-any-tenant",
        SIGNALS,
        "            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');",
        "            WITH CHECK (kind = 'signal');",
        (T + "test_access.py",),
        "agent_signals_agent_send: the agent role signals another tenant's task",
    ),
    m(
        "signal-wait-forgets-what-it-read",
        "agentdb/worker/finish.py",
        "                    signals_read=job.signals_read,",
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
)
