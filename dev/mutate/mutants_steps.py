"""Mutants of the durable handlers (G25): the steps' table and guard, their statements, the
straight-line API, and what the worker does with an effect whose outcome is unknown (G13)."""

from __future__ import annotations

from dev.mutate.catalogue import (
    ATTACKS,
    M_STEPS,
    MIGRATIONS,
    Mutant,
    T,
    m,
)

STEPS_SQL = "agentdb/queries/steps.sql"
DURABLE = "agentdb/worker/durable.py"
JOB = "agentdb/worker/job.py"
TESTS = T + "test_durable.py"
KIT = T + "test_testing_kit.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- the database's rules ------------------------------------------------------------
    m(
        "steps-guard-any-token",
        MIGRATIONS,
        "    IF task.state <> 'running' OR task.lease_token <> NEW.lease_token THEN\n",
        "    IF task.state <> 'running' THEN\n",
        (ATTACKS + "::test_attack_is_refused[G25-agent_steps_guard]",),
        "agentdb_guard_step: a worker whose lease was taken over records a step (G12)",
        within="agentdb_guard_step",
    ),
    m(
        "steps-guard-finished-task",
        MIGRATIONS,
        "    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN\n",
        "    IF false THEN\n",
        (ATTACKS + "::test_attack_is_refused[G20-agent_steps_guard]",),
        "agentdb_guard_step: a finished task's step is refused as a lease problem, not AG012",
        within="agentdb_guard_step",
    ),
    m(
        "steps-guard-recorded-changes",
        MIGRATIONS,
        "           OLD.state <> 'waiting' OR NEW.state <> 'done'\n",
        "           NEW.state <> 'done'\n",
        (ATTACKS + "::test_attack_is_refused[G25-agent_steps_guard-recorded]",),
        "agentdb_guard_step: a recorded (done) step's result may be rewritten",
        within="agentdb_guard_step",
    ),
    m(
        "steps-guard-takes-any-signal",
        MIGRATIONS,
        "    IF NEW.signal_seq IS NOT NULL AND NOT EXISTS (\n",
        "    IF false AND NOT EXISTS (\n",
        (ATTACKS + "::test_attack_is_refused[G25-agent_steps_guard-no-signal]",),
        "agentdb_guard_step: a step takes a signal its task was never sent",
        within="agentdb_guard_step",
    ),
    m(
        "steps-signal-taken-twice",
        M_STEPS,
        "    CONSTRAINT agent_steps_signal_key UNIQUE (tenant_id, task_id, signal_seq),\n",
        "",
        (ATTACKS + "::test_attack_is_refused[G25-agent_steps_signal_key]",),
        "agent_steps: two steps may take one signal (an approval read twice)",
    ),
    m(
        "outbox-message-for-a-cancelled-task",
        MIGRATIONS,
        "    IF task_state = 'cancelled' THEN\n",
        "    IF false THEN\n",
        (
            ATTACKS + "::test_attack_is_refused[G20-agent_outbox_for_open_task]",
            TESTS + "::test_G20_a_message_enqueued_for_a_cancelled_task_is_refused",
        ),
        "agentdb_guard_outbox_task: a message naming a cancelled task is enqueued (G20)",
        within="agentdb_guard_outbox_task",
    ),
    m(
        "delete-tenant-leaves-its-steps",
        MIGRATIONS,
        "        DELETE FROM agent_steps s WHERE s.tenant_id = p_tenant;\n"
        "        GET DIAGNOSTICS n_steps = ROW_COUNT;\n",
        "        n_steps := 0;\n",
        (T + "test_tenant_deletion.py",),
        "agentdb_delete_tenant: the tenant's steps stay, and its tasks cannot go (G17)",
        within="agentdb_delete_tenant",
    ),
    m(
        "purge-leaves-steps",
        MIGRATIONS,
        "        DELETE FROM agent_steps s\n        USING agent_tasks k\n"
        "        WHERE s.tenant_id = p_tenant AND k.tenant_id = p_tenant AND k.id = s.task_id\n",
        "        DELETE FROM agent_steps s\n        USING agent_tasks k\n"
        "        WHERE false AND s.tenant_id = p_tenant AND k.tenant_id = p_tenant"
        " AND k.id = s.task_id\n",
        (T + "test_retention.py::test_G9_G25_a_purged_task_takes_its_steps_with_it",),
        "agentdb_purge_tasks: a finished task's steps stay, so the task is never purged",
        within="agentdb_purge_tasks",
    ),
    m(
        "purge-leaves-steps-of-every-tenant",
        MIGRATIONS,
        "        DELETE FROM agent_steps s\n        USING agent_tasks k\n"
        "        WHERE k.tenant_id = s.tenant_id AND k.id = s.task_id\n",
        "        DELETE FROM agent_steps s\n        USING agent_tasks k\n"
        "        WHERE false AND k.tenant_id = s.tenant_id AND k.id = s.task_id\n",
        (T + "test_retention.py::test_G9_G25_a_purged_task_takes_its_steps_with_it",),
        "agentdb_purge_tasks (every tenant): a finished task's steps stay; it is never purged",
        within="agentdb_purge_tasks",
    ),
    m(
        "step-take-ignores-taken",
        STEPS_SQL,
        "      AND NOT EXISTS (SELECT 1 FROM agent_steps s\n"
        "                      WHERE s.tenant_id = $1 AND s.task_id = $2 AND s.signal_seq = g.seq)\n",
        "",
        (TESTS + "::test_G25_a_wait_takes_one_signal_once_and_a_re_entry_gets_the_same_one",),
        "step_take_signal: a second wait takes the signal the first one took",
        within="step_take_signal",
    ),
    m(
        "wait-refunds-no-attempt",
        "agentdb/queries/tasks.sql",
        "                        THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,",
        "                        THEN t.attempts ELSE t.attempts END,",
        (TESTS + "::test_G25_a_sleep_ends_once",),
        "task_transition: a run that ends waiting keeps its attempt (waits wear a task out)",
        within="task_transition",
    ),
    # ---- the straight-line API ---------------------------------------------------------------
    m(
        "step-replayed-for-other-arguments",
        DURABLE,
        "        if found.kind != kind or found.input_hash != digest:",
        "        if found.kind != kind:",
        (TESTS,),
        "Durable: a step name reached with other arguments replays the other call's result",
        within="Durable._recorded",
    ),
    m(
        "effect-replay-asks-the-database",
        DURABLE,
        '        if found is not None and found.state == "succeeded":',
        "        if False:",
        (TESTS + "::test_G25_replaying_k_recorded_steps_costs_one_round_trip",),
        "Durable.effect: a recorded effect is replayed by a reserve, not from the ledger read",
        within="Durable.effect",
    ),
    m(
        "effect-definite-failure-as-unknown",
        DURABLE,
        "            await self.fail(op, describe(exc))",
        "            await self.mark_unknown(op, describe(exc))",
        (TESTS,),
        "Durable.effect: a definite failure (NotPerformed) is recorded unknown",
        within="Durable.effect",
    ),
    m(
        "step-result-unmasked",
        DURABLE,
        "    return json_value(redaction.mask(value), cap=OBJECT_CAP,",
        "    return json_value(value, cap=OBJECT_CAP,",
        (TESTS,),
        "Durable: a step's result is stored with its secrets",
        within="_stored",
    ),
    m(
        "wait-leaves-the-cursor",
        DURABLE,
        "        self.signals_read = max(self.signals_read or 0, taken.last_seq) or None",
        "        self.signals_read = self.signals_read",
        (TESTS + "::test_G25_a_wait_takes_one_signal_once_and_a_re_entry_gets_the_same_one",),
        "Durable.wait_for_signal: the wait does not sleep past the signals already taken",
        within="Durable.wait_for_signal",
    ),
    m(
        "run-children-no-quorum",
        DURABLE,
        "        need = len(wanted) if quorum is None else quorum",
        "        need = len(wanted)",
        (TESTS + "::test_G25_a_quorum_returns_the_results_it_saw_and_keeps_them",),
        "Durable.run_children: a quorum waits for every child",
        within="Durable.run_children",
    ),
    # ---- an unknown outcome, with and without a hook (G13) ---------------------------------
    m(
        "recover-manual-called-again",
        JOB,
        "            if policy == MANUAL:\n                raise OperationUnsettled(op)\n",
        "",
        (TESTS, T + "test_worker.py"),
        "Job._recover: an effect declared MANUAL is called again instead of parked",
        within="Job._recover",
    ),
    m(
        "recover-never-called-again",
        JOB,
        "            return Reservation(await operations.start(self.pool, op, lease=self.lease), "
        "fresh=True)\n",
        "            raise OperationUnsettled(op)\n",
        (TESTS, T + "test_worker.py"),
        "Job._recover: without a hook the provider is never called again (the README's trap)",
        within="Job._recover",
    ),
    m(
        "recover-own-attempt-twice",
        JOB,
        "            if busy.operation.task_id != self.task.id or busy.operation.id in self._fresh:",
        "            if busy.operation.task_id != self.task.id:",
        (T + "test_worker.py::test_G13_a_key_reserved_twice_in_one_attempt_is_in_flight",),
        "Job.reserve: a key reserved twice in one attempt is handed out fresh twice",
        within="Job._reserve_effect",
    ),
    m(
        "parked-spends-its-attempt",
        "agentdb/worker/loop.py",
        "                    refund_attempt=True,\n                )\n                self.stats.parked += 1",
        "                    refund_attempt=False,\n                )\n                self.stats.parked += 1",
        (TESTS, T + "test_worker.py"),
        "worker: a task parked for an operator spends an attempt each time it looks",
        within="Worker._run_job",
    ),
    m(
        "cursor-moves-on-every-wait",
        "agentdb/worker/finish.py",
        "                    signals_read=job.signals_read if outcome.signal is not None else None,",
        "                    signals_read=job.signals_read,",
        (TESTS,),
        "worker: a Wait for children moves the signal cursor (the README's approval trap)",
        within="Finisher._write",
    ),
    m(
        "lease-watch-blind",
        "agentdb/worker/loop.py",
        "                if held.get(job.task.id) != job.lease.token:\n"
        "                    job.nudge.set()\n",
        "                pass\n",
        (TESTS + "::test_G20_a_cancel_stops_a_handler_inside_a_long_step_by_the_lease_watch",),
        "worker: the lease watch never tells a job its lease went",
        within="Worker._watch",
    ),
)
