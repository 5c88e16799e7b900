"""Mutants of what a holder may do after taking a task over from an expired lease (a
reclaim, not a first claim), and of a finishing write whose answer was lost on the
task's last attempt or while another worker moved the task."""

from __future__ import annotations

from dev.mutate.catalogue import FENCES, LEASES_SQL, Mutant, T, m

FINISH = "agentdb/worker/finish.py"
FINISHING = T + "test_worker_finishing.py"

MUTANTS: tuple[Mutant, ...] = (
    m(
        "reclaim-continues-the-attempt",
        LEASES_SQL,
        "        attempts = t.attempts + 1,",
        "        attempts = CASE WHEN p.from_state = 'running' THEN t.attempts"
        " ELSE t.attempts + 1 END,",
        (T + "test_leases.py::test_G12_fenced_out_holder_changes_nothing",),
        "lease_claim: a take-over continues the stalled attempt instead of counting one, so a "
        "task whose workers keep dying is taken over for ever, never dead",
        within="lease_claim",
    ),
    m(
        "reclaim-step-finished-under-the-old-token",
        "agentdb/queries/steps.sql",
        "SET state = 'done', result = $4, lease_token = $6, updated_at = now()",
        "SET state = 'done', result = $4, updated_at = now()",
        (T + "test_durable.py::test_G25_children_run_once_and_their_results_are_recorded",),
        "step_finish: a waiting step keeps the token of the holder that recorded it, so the "
        "holder after it (a take-over, or the claim after the wait) can never finish it",
        within="step_finish",
    ),
    m(
        "reclaim-watch-by-owner-only",
        "agentdb/worker/loop.py",
        "                if held.get(job.task.id) != job.lease.token:",
        "                if job.task.id not in held:",
        (FENCES + "::test_G12_a_worker_stops_the_attempt_a_same_owner_restart_took_over",),
        "lease watch: a task taken over by a restart under the same worker id still counts as "
        "the stale attempt's, whose handler runs on until its heartbeat",
        within="Worker._watch",
    ),
    m(
        "reclaim-lone-lost-answer-not-checked",
        FINISH,
        "                if (failures or maybe_landed) and await self._landed(job, lands_in):",
        "                if maybe_landed and await self._landed(job, lands_in):",
        (
            FINISHING
            + "::test_a_lone_success_on_the_last_attempt_whose_answer_was_lost_is_found_landed",
        ),
        "Finisher.persist: a lone write whose answer was lost is not checked for having landed "
        "(its own success counted as a lease taken over)",
        within="Finisher.persist",
    ),
    m(
        "reclaim-lost-release-dead-not-landed",
        FINISH,
        '            lands_in=("pending", "dead"),\n        )\n        # A release whose answer',
        '            lands_in=("pending",),\n        )\n        # A release whose answer',
        (FINISHING + "::test_a_give_back_on_the_last_attempt_whose_answer_was_lost_is_found_dead",),
        "Finisher._retry: a release that landed the task 'dead' on its last attempt, its answer "
        "lost, is read as a lease taken over",
        within="Finisher._retry",
    ),
    m(
        "reclaim-lost-release-death-uncounted",
        FINISH,
        "            else not outcome.refund_attempt and task.attempts >= task.max_attempts\n",
        "            else False\n",
        (FINISHING + "::test_a_give_back_on_the_last_attempt_whose_answer_was_lost_is_found_dead",),
        "Finisher._retry: a task that died of its last attempt, the release's answer lost, is "
        "counted as retried (the bug fixed with this test)",
        within="Finisher._retry",
    ),
    m(
        "reclaim-give-back-logged-pending",
        FINISH,
        '            state = "dead" if job.task.attempts >= job.task.max_attempts else "pending"\n',
        '            state = "pending"\n',
        (
            FINISHING
            + "::test_a_last_attempt_released_after_its_finish_kept_failing_is_logged_dead",
        ),
        "Finisher.give_back: a last attempt's release whose answer was lost is logged as "
        "leaving the task pending, though it died (the bug fixed with this test)",
        within="Finisher.give_back",
    ),
    m(
        "reclaim-landed-any-version",
        FINISH,
        "            now.state in lands_in\n"
        "            and now.state_version == job.task.state_version + 1\n",
        "            now.state in lands_in\n",
        (
            FINISHING
            + "::test_a_finishing_write_lost_while_another_worker_took_over_is_a_late_write",
        ),
        "Finisher._landed: another worker's finish of a task taken over is read as this "
        "worker's own write landing",
        within="Finisher._landed",
    ),
)
