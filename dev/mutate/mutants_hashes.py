"""Mutants of the idempotency hashes - every field a dedupe or definition hash must
cover, not only the payload - and of the errors the library documents at its boundary.

Left out, being equivalent: dropping a signal's ``kind`` from its dedupe hash. The
``decision`` beside it is None exactly for a plain signal and set exactly for an
approval, so the kind never tells two requests apart that the decision does not.
"""

from __future__ import annotations

from dev.mutate.catalogue import Mutant, T, m

HASHING = T + "test_hashing.py::"
API = T + "test_api.py::"
SIGNALS = "agentdb/signals.py"
SCHEDULES = "agentdb/schedules.py"
DURABLE = "agentdb/worker/durable.py"
LEASES = "agentdb/leases.py"

SIGNAL_KEY = HASHING + "test_G4_a_signal_key_replayed_with_another_name_or_sender_is_refused"
APPROVAL_KEY = (
    HASHING + "test_G4_an_approval_key_replayed_by_another_approver_or_decision_is_refused"
)
SCHEDULE_DEFINITION = (
    HASHING + "test_G4_a_schedule_recreated_with_one_part_of_its_definition_changed_is_refused"
)
FAN_OUT = HASHING + "test_G25_a_fan_out_reached_for_other_children_or_another_quorum_is_a_conflict"
WAIT_OR_SLEEP = (
    HASHING + "test_G25_a_wait_or_sleep_reached_for_another_signal_or_duration_is_a_conflict"
)
LEASE_TTL = API + "test_a_lease_ttl_out_of_bounds_is_a_configuration_error_for_claim_and_renew"
JOB_ARGS = API + "test_a_durable_steps_bad_arguments_are_configuration_errors_recording_nothing"

MUTANTS: tuple[Mutant, ...] = (
    # ---- signals.signal / signals.approve: name, kind, decision, sender, payload -------------
    m(
        "hash-signal-drops-sender",
        SIGNALS,
        '"decision": decision, "sender": sender,',
        '"decision": decision,',
        (SIGNAL_KEY, APPROVAL_KEY),
        "signals: another sender (approver) under a used key is answered with the first's signal",
        within="_send",
    ),
    m(
        "hash-signal-drops-decision",
        SIGNALS,
        '"kind": kind, "decision": decision, ',
        '"kind": kind, ',
        (APPROVAL_KEY,),
        "signals.approve: a rejection under the key of an approval is answered 'approved'",
        within="_send",
    ),
    m(
        "hash-signal-drops-name",
        SIGNALS,
        '{"name": name, "kind": kind,',
        '{"kind": kind,',
        (SIGNAL_KEY,),
        "signals: another signal name under a used key is answered with the first signal",
        within="_send",
    ),
    m(
        "hash-signal-drops-payload",
        SIGNALS,
        '"payload": dict(payload or {})}',
        '"payload": {}}',
        (
            T + "test_signals.py::test_G22_a_signal_is_recorded_once_per_key_with_its_event",
            APPROVAL_KEY,
        ),
        "signals: another payload (an approval's comment) under a used key is answered",
        within="_send",
    ),
    # ---- tasks.create: params (the type is compared beside the hash), not the deadline -------
    m(
        "hash-task-drops-params",
        "agentdb/tasks.py",
        "    digest = input_hash(dict(params or {})) if dedupe_key is not None else None",
        "    digest = input_hash({}) if dedupe_key is not None else None",
        (T + "test_tasks.py::test_G4_create_with_the_same_dedupe_key_and_other_params_is_refused",),
        "tasks.create: a dedupe key reused with other params answers with the first task",
        within="create",
    ),
    m(
        "hash-task-hashes-the-deadline",
        "agentdb/tasks.py",
        "    digest = input_hash(dict(params or {})) if dedupe_key is not None else None",
        '    digest = input_hash({**(params or {}), "$deadline": str(deadline)})'
        " if dedupe_key is not None else None",
        (HASHING + "test_G4_a_task_retried_with_a_recomputed_deadline_gets_the_first_task",),
        "tasks.create: a retry whose deadline was computed again (now + 1h) is refused",
        within="create",
    ),
    # ---- operations.reserve / reserve_many: the input (and the action beside it) -------------
    m(
        "hash-reserve-hashes-the-action",
        "agentdb/operations.py",
        "    digest = input_hash(input)",
        "    digest = input_hash(action)",
        (T + "test_operations.py::test_G4_same_key_different_input_is_a_conflict_never_a_replay",),
        "operations.reserve: the same key with another input is answered with the stored result",
        within="reserve",
    ),
    m(
        "hash-reserve-many-hashes-the-action",
        "agentdb/operations.py",
        "    digests = [input_hash(req.input) for req in batch]",
        "    digests = [input_hash(req.action) for req in batch]",
        (T + "test_complete_many.py::test_G4_reserve_many_answers_each_key_like_reserve",),
        "operations.reserve_many: a batch element with another input gets the stored result",
        within="_reserve_many",
    ),
    # ---- schedules.create: the definition hash, not the anchor -------------------------------
    m(
        "hash-schedule-drops-task-type",
        SCHEDULES,
        '"task_type": args["task_type"], ',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created for another task type answers with the first",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-workflow-version",
        SCHEDULES,
        '"workflow_version": args["workflow_version"],',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created for another workflow version answers",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-params",
        SCHEDULES,
        '"params": dict(params or {}), ',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created with other params answers with the first",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-cron",
        SCHEDULES,
        '"cron": args["cron"], ',
        "",
        (T + "test_schedules.py::test_G24_create_is_idempotent_by_name_and_refuses_bad_rules",),
        "schedules.create: a schedule re-created with another cron rule answers with the first",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-catch-up",
        SCHEDULES,
        '"catch_up": args["catch_up"],',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created with another catch-up policy answers",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-every",
        SCHEDULES,
        '"every": None if every is None else every.total_seconds(),',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created with another interval answers with the first",
        within="_definition",
    ),
    m(
        "hash-schedule-drops-task-deadline",
        SCHEDULES,
        '"task_deadline": None if deadline is None else deadline.total_seconds(),',
        "",
        (SCHEDULE_DEFINITION,),
        "schedules.create: a schedule re-created with another task deadline answers",
        within="_definition",
    ),
    m(
        "hash-schedule-hashes-the-anchor",
        SCHEDULES,
        '"task_deadline": None if deadline is None else deadline.total_seconds(),',
        '"task_deadline": None if deadline is None else deadline.total_seconds(),\n'
        '        "anchor": str(args.get("start_at")),',
        (HASHING + "test_G4_a_schedule_recreated_with_another_anchor_is_the_same_schedule",),
        "schedules.create: a retried create with an explicit start_at is refused",
        within="_definition",
    ),
    # ---- Durable steps: what each kind of step binds to its name ------------------------------
    m(
        "hash-step-drops-kwargs",
        DURABLE,
        'digest = _hash(name, {"args": list(args), "kwargs": kwargs})',
        'digest = _hash(name, {"args": list(args)})',
        (HASHING + "test_G25_a_step_reached_with_other_keyword_arguments_is_a_conflict",),
        "Job.step: a step reached with other keyword arguments replays the other call's result",
        within="Durable.step",
    ),
    m(
        "hash-wait-drops-signal",
        DURABLE,
        '{"signal": signal, "timeout": seconds}',
        '{"timeout": seconds}',
        (WAIT_OR_SLEEP,),
        "Job.wait_for_signal: a wait reached for another signal replays the first one's",
        within="Durable.wait_for_signal",
    ),
    m(
        "hash-sleep-drops-duration",
        DURABLE,
        '{"sleep": duration.total_seconds()}',
        '{"sleep": None}',
        (WAIT_OR_SLEEP,),
        "Job.sleep: a sleep reached with another duration replays the first one's",
        within="Durable.sleep",
    ),
    m(
        "hash-children-drops-quorum",
        DURABLE,
        '"children": [list(w) for w in wanted], "quorum": quorum}',
        '"children": [list(w) for w in wanted]}',
        (FAN_OUT,),
        "Job.run_children: a fan-out reached with another quorum sleeps on the first one's wait",
        within="Durable.run_children",
    ),
    m(
        "hash-children-drops-children",
        DURABLE,
        '"children": [list(w) for w in wanted], "quorum": quorum}',
        '"quorum": quorum}',
        (FAN_OUT,),
        "Job.run_children: a fan-out reached for other children sleeps on the first one's wait",
        within="Durable.run_children",
    ),
    m(
        "hash-effect-replay-ignores-action",
        DURABLE,
        "            if found.input_hash != digest or found.action != act:",
        "            if found.input_hash != digest:",
        (HASHING + "test_G25_an_effect_key_reused_for_another_action_is_a_conflict",),
        "Job.effect: a refund under a charge's key is answered with the charge's result",
        within="Durable.effect",
    ),
    # ---- documented errors at the boundary ------------------------------------------------------
    m(
        "boundary-deliver-and-claim-any-visibility",
        "agentdb/outbox.py",
        "    if visibility <= timedelta(0):\n"
        "        # As for claim: a lease over at once lets another relay publish the message too.\n"
        '        raise ConfigurationError(f"visibility must be positive, not {visibility}")\n'
        "    return await _deliver_and_claim_rows(",
        "    return await _deliver_and_claim_rows(",
        (API + "test_deliver_and_claim_refuses_a_lease_that_has_already_run_out",),
        "outbox.deliver_and_claim: a visibility of 0 leases a message another relay takes at once",
        within="_deliver_and_claim",
    ),
    m(
        "boundary-claim-lease-ttl-unchecked",
        LEASES,
        "    _no_string(task_types)\n    _ttl(lease_ttl)\n",
        "    _no_string(task_types)\n",
        (LEASE_TTL,),
        "leases.claim: lease_ttl 0 is a raw InvariantViolation, 2 days a lease past the bound",
        within="claim",
    ),
    m(
        "boundary-renew-lease-ttl-unchecked",
        LEASES,
        "    _ttl(lease_ttl)\n    row = await _db.fetch_optional(",
        "    row = await _db.fetch_optional(",
        (LEASE_TTL,),
        "leases.renew: lease_ttl 0 renews the lease to one already over",
        within="renew",
    ),
    m(
        "boundary-step-name-unchecked",
        DURABLE,
        "    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX:",
        "    if not isinstance(name, str):",
        (JOB_ARGS,),
        "Job: an empty step name reaches the database's CHECK (a raw InvariantViolation)",
        within="_name",
    ),
    m(
        "boundary-children-quorum-unchecked",
        DURABLE,
        "        if not wanted or not 1 <= need <= len(wanted):",
        "        if not wanted:",
        (JOB_ARGS,),
        "Job.run_children: a quorum of 0 or over the children is not refused up front",
        within="Durable.run_children",
    ),
    m(
        "boundary-sleep-negative-unchecked",
        DURABLE,
        "        if not isinstance(duration, timedelta) or duration < timedelta(0):",
        "        if not isinstance(duration, timedelta):",
        (JOB_ARGS,),
        "Job.sleep: a negative duration is recorded as a sleep instead of refused",
        within="Durable.sleep",
    ),
    m(
        "boundary-wait-timeout-negative-unchecked",
        DURABLE,
        "        if seconds is not None and not seconds >= 0:",
        "        if False:",
        (JOB_ARGS,),
        "Job.wait_for_signal: a negative timeout is recorded as a wait instead of refused",
        within="Durable.wait_for_signal",
    ),
    m(
        "boundary-concurrency-limit-unchecked",
        "agentdb/tenancy.py",
        "not isinstance(max_running, int) or max_running < 0\n",
        "not isinstance(max_running, int)\n",
        (T + "test_fairness.py::test_G18_set_concurrency_limit_refuses_bad_input",),
        "tenancy.set_concurrency_limit: a negative cap is not refused up front",
        within="set_concurrency_limit",
    ),
)
