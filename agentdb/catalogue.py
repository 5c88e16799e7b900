"""Every named schema object, and the guarantee it serves (public API: errors map on names).

:data:`CATALOGUE` lists each constraint, guard trigger, unique or claim index
and RLS policy of the schema (``tests/test_catalogue.py`` checks it equals the
migrated schema); :data:`RULES` splits a guard trigger that raises several
SQLSTATEs into one rule per SQLSTATE, each with its own guarantee. The
guarantees themselves are :data:`agentdb.guarantees.GUARANTEES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["CATALOGUE", "CONSTRAINTS", "RULES", "Entry", "Rule", "guarantee_of"]


@dataclass(frozen=True, slots=True)
class Entry:
    """A named schema object (constraint, trigger, index, policy) and what it serves.

    ``guarantee`` is ``None`` for a hint that no guarantee rests on (the
    NOTIFY triggers: listeners poll anyway). ``error`` names the agentdb
    error class a refusal by this object maps to when it is not the default
    for its SQLSTATE.
    """

    name: str
    guarantee: str | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a guard trigger that raises several SQLSTATEs."""

    name: str
    sqlstate: str
    guarantee: str
    rule: str


def _entries(guarantee: str | None, *names: str, error: str = "") -> tuple[Entry, ...]:
    return tuple(Entry(n, guarantee, error) for n in names)


#: Every named constraint, guard trigger, unique/claim index and RLS policy
#: of the schema (tests/test_catalogue.py checks it equals the migrated schema).
CATALOGUE: Final[tuple[Entry, ...]] = (
    # G2: tenant-leading keys and composite tenant foreign keys on every child.
    *_entries(
        "G2",
        "agent_tenants_pkey",
        "agent_tasks_pkey",
        "agent_operations_pkey",
        "agent_events_pkey",
        "agent_outbox_pkey",
        "agent_artifacts_pkey",
        "agent_credential_refs_pkey",
        "agent_principals_pkey",
        "agent_principals_tenant_fkey",
        "agent_tasks_tenant_fkey",
        "agent_concurrency_limits_tenant_fkey",
        "agent_operations_task_fkey",
        "agent_events_task_fkey",
        "agent_events_operation_fkey",
        "agent_outbox_tenant_fkey",
        "agent_outbox_task_fkey",
        "agent_inbox_tenant_fkey",
        "agent_artifacts_tenant_fkey",
        "agent_artifacts_task_fkey",
        "agent_artifacts_operation_fkey",
        "agent_credential_refs_tenant_fkey",
        "agent_operations_task_idx",
        "agent_outbox_task_idx",
        "agent_artifacts_task_idx",
        "agent_artifacts_operation_idx",
        "agent_budgets_tenant_fkey",
        "agent_budgets_task_fkey",
        "agent_budget_holds_operation_fkey",
        "agent_budget_holds_budget_fkey",
        "agent_budget_holds_budget_idx",
        "agent_rate_limits_tenant_fkey",
    ),
    # G3: one logical operation / task per key per tenant.
    *_entries("G3", "agent_tasks_dedupe_key", "agent_operations_idempotency_key"),
    # G4: keys come with the hash of the request they answered.
    *_entries(
        "G4",
        "agent_tasks_dedupe_has_hash",
        "agent_tasks_dedupe_key_valid",
        "agent_tasks_input_hash_format",
        "agent_operations_input_hash_format",
    ),
    # G5: valid states, owners, leases, counters and lengths.
    *_entries(
        "G5",
        "agent_tenants_state_valid",
        "agent_tenants_name_valid",
        "agent_principals_role_name_valid",
        "agent_tasks_state_valid",
        "agent_tasks_state_version_valid",
        "agent_tasks_task_type_valid",
        "agent_tasks_workflow_version_valid",
        "agent_tasks_current_step_valid",
        "agent_tasks_due_has_wake_at",
        "agent_tasks_attempts_valid",
        "agent_tasks_last_error_valid",
        "agent_operations_state_valid",
        "agent_operations_state_version_valid",
        "agent_operations_idempotency_key_valid",
        "agent_operations_action_valid",
        "agent_operations_attempts_valid",
        "agent_operations_provider_reference_valid",
        "agent_operations_error_valid",
        "agent_operations_succeeded_has_no_error",
        "agent_events_event_type_valid",
        "agent_events_actor_id_valid",
        "agent_events_policy_version_valid",
        "agent_events_state_valid",
        "agent_events_operation_version_has_operation",
        "agent_outbox_state_valid",
        "agent_outbox_topic_valid",
        "agent_outbox_attempts_valid",
        "agent_outbox_delivered_at_valid",
        "agent_outbox_lease_owner_valid",
        "agent_outbox_lease_token_valid",
        "agent_outbox_last_error_valid",
        "agent_inbox_consumer_valid",
        "agent_artifacts_kind_valid",
        "agent_artifacts_uri_valid",
        "agent_artifacts_sha256_format",
        "agent_artifacts_size_valid",
        "agent_artifacts_content_type_valid",
        "agent_credential_refs_name_key",
        "agent_credential_refs_name_valid",
        "agent_credential_refs_provider_valid",
    ),
    # G6: lifecycle edges.
    *_entries(
        "G6",
        "agent_transitions_pkey",
        "agent_transitions_entity_valid",
        "agent_transitions_no_self_loop",
        "agent_tasks_transition_guard",
        "agent_operations_transition_guard",
        "agent_outbox_transition_guard",
    ),
    # G7: versioned writes; the version guards' other rules are in RULES.
    *_entries("G7", "agent_tasks_version_guard", "agent_operations_version_guard"),
    # G8: append-only audit, one event per state change.
    *_entries(
        "G8",
        "agent_events_append_only",
        "agent_events_no_truncate",
        "agent_tasks_event_required",
        "agent_operations_event_required",
        "agent_events_task_version_key",
        "agent_events_operation_version_key",
    ),
    # G9: bounded, redacted payloads and their retention.
    *_entries(
        "G9",
        "agent_tasks_params_valid",
        "agent_signals_payload_valid",
        "agent_schedules_params_valid",
        "agent_operations_result_valid",
        "agent_events_payload_size",
        "agent_outbox_payload_size",
        error="PayloadTooLarge",
    ),
    *_entries("G9", "agent_events_payload_no_secrets", error="SecretInPayload"),
    *_entries(
        "G9",
        "agent_events_retention_order",
        "agent_events_expiry_idx",
        "agent_operations_settled_idx",
        "agent_tasks_finished_idx",
    ),
    # G10: the relay's paths over delivery state.
    *_entries(
        "G10", "agent_outbox_pending_idx", "agent_outbox_delivered_idx", "agent_outbox_dead_idx"
    ),
    # G11: consumer-side dedupe.
    *_entries("G11", "agent_inbox_pkey", "agent_inbox_processed_at_idx"),
    # G12: leases and fencing tokens.
    *_entries(
        "G12",
        "agent_tasks_lease_complete",
        "agent_tasks_lease_window",
        "agent_tasks_running_is_leased",
        "agent_tasks_lease_owner_valid",
        "agent_tasks_lease_token_valid",
        "agent_tasks_lease_ttl_valid",
        "agent_tasks_lease_expiry_idx",
    ),
    # G18: fair claiming and concurrency caps.
    *_entries(
        "G18",
        "agent_tasks_due_idx",
        "agent_tasks_running_idx",
        "agent_tasks_concurrency_guard",
        "agent_concurrency_limits_pkey",
        "agent_concurrency_limits_max_running_valid",
        "agent_concurrency_limits_task_type_valid",
    ),
    # G19: budgets, their holds and rate limits.
    *_entries(
        "G19",
        "agent_budgets_pkey",
        "agent_budgets_scope_key",
        "agent_budgets_unit_valid",
        "agent_budgets_period_valid",
        "agent_budgets_amounts_valid",
        "agent_budgets_guard",
        "agent_budget_holds_pkey",
        "agent_budget_holds_amount_valid",
        "agent_budget_holds_state_valid",
        "agent_budget_holds_settled_valid",
        "agent_budget_holds_guard",
        "agent_rate_limits_pkey",
        "agent_rate_limits_action_valid",
        "agent_rate_limits_per_valid",
        "agent_rate_limits_used_valid",
        "agent_global_rate_limits_pkey",
        "agent_global_rate_limits_action_valid",
        "agent_global_rate_limits_per_valid",
        "agent_global_rate_limits_used_valid",
        "agent_operations_rate_limit",
        "agent_operations_rate_limit_retry",
    ),
    *_entries("G19", "agent_budgets_within_limit", error="BudgetExceeded"),
    *_entries(
        "G19",
        "agent_rate_limits_within_limit",
        "agent_global_rate_limits_within_limit",
        error="RateLimited",
    ),
    # G22: a signal reaches its task once, in order, and wakes it; approvals are not the agent's.
    *_entries(
        "G22",
        "agent_signals_seq_key",
        "agent_signals_access",
        "agent_signals_guard",
        "agent_signals_deliver",
        "agent_signals_immutable",
        "agent_signals_decision_valid",
        "agent_tasks_signal_guard",
        "agent_signals_owner_all",
        "agent_signals_runtime_all",
        "agent_signals_agent_scope",
        "agent_signals_agent_send",
    ),
    *_entries("G2", "agent_signals_pkey", "agent_signals_tenant_fkey", "agent_signals_task_fkey"),
    *_entries("G3", "agent_signals_dedupe_key"),
    *_entries(
        "G4",
        "agent_signals_dedupe_has_hash",
        "agent_signals_dedupe_key_valid",
        "agent_signals_input_hash_format",
    ),
    *_entries(
        "G5",
        "agent_signals_seq_valid",
        "agent_signals_name_valid",
        "agent_signals_kind_valid",
        "agent_signals_sender_valid",
        "agent_tasks_wait_signal_valid",
        "agent_tasks_signal_cursor_valid",
    ),
    # G23: children in their parent's tenant, once per key; the parent woken exactly once.
    *_entries(
        "G23",
        "agent_tasks_child_key",
        "agent_tasks_child_dedupe_reserved",
        "agent_tasks_child_guard",
        "agent_tasks_fan_in",
        "agent_tasks_children_guard",
    ),
    *_entries("G2", "agent_tasks_parent_fkey"),
    *_entries("G5", "agent_tasks_child_key_valid", "agent_tasks_wait_children_valid"),
    *_entries("G17", "agent_tasks_keep_parent"),
    # G24: a schedule fires at most one task per tick.
    *_entries(
        "G24",
        "agent_tasks_schedule_tick_key",
        "agent_tasks_schedule_guard",
        "agent_tasks_schedule_fixed",
        "agent_schedules_name_key",
        "agent_schedules_one_rule",
        "agent_schedules_every_valid",
        "agent_schedules_cron_valid",
        "agent_schedules_anchor_valid",
        "agent_schedules_catch_up_valid",
        "agent_schedules_next_tick_valid",
        "agent_schedules_due_idx",
        "agent_schedules_owner_all",
        "agent_schedules_runtime_all",
    ),
    *_entries("G2", "agent_schedules_pkey", "agent_schedules_tenant_fkey"),
    *_entries(
        "G5",
        "agent_schedules_name_valid",
        "agent_schedules_task_type_valid",
        "agent_schedules_workflow_version_valid",
        "agent_schedules_task_deadline_valid",
        "agent_tasks_schedule_tick_valid",
    ),
    # G21: past a deadline a task only ends.
    *_entries("G21", "agent_tasks_deadline_guard", "agent_tasks_deadline_idx"),
    # G20: nothing is reserved for a finished task.
    *_entries("G20", "agent_operations_for_open_task", "agent_operations_for_open_task_retry"),
    # G13: operations that still need reconciling are found by index.
    *_entries("G13", "agent_operations_unsettled_idx"),
    # G2 (0013.operator): one tenant per name, so a name finds one tenant.
    *_entries("G2", "agent_tenants_name_key"),
    # G15 (0013.operator): the operator's console sees and writes one tenant per
    # transaction.
    *_entries(
        "G15",
        "agent_tenants_operator_scope",
        "agent_tasks_operator_scope",
        "agent_operations_operator_scope",
        "agent_events_operator_scope",
        "agent_outbox_operator_scope",
        "agent_signals_operator_scope",
        "agent_steps_operator_scope",
        "agent_budgets_operator_scope",
        "agent_budget_holds_operator_scope",
        "agent_concurrency_limits_operator_scope",
    ),
    # G15: row-level security and the approved write path.
    *_entries(
        "G15",
        "agentdb_tenant_scope",
        "agent_tenants_owner_all",
        "agent_tenants_runtime_all",
        "agent_tenants_agent_scope",
        "agent_tasks_owner_all",
        "agent_tasks_runtime_all",
        "agent_tasks_agent_scope",
        "agent_operations_owner_all",
        "agent_operations_runtime_all",
        "agent_operations_agent_scope",
        "agent_events_owner_all",
        "agent_events_runtime_all",
        "agent_events_agent_scope",
        "agent_outbox_owner_all",
        "agent_outbox_runtime_all",
        "agent_inbox_owner_all",
        "agent_inbox_runtime_all",
        "agent_artifacts_owner_all",
        "agent_artifacts_runtime_all",
        "agent_artifacts_agent_scope",
        "agent_credential_refs_owner_all",
        "agent_credential_refs_runtime_all",
        "agent_concurrency_limits_owner_all",
        "agent_concurrency_limits_runtime_all",
        "agent_budgets_owner_all",
        "agent_budgets_runtime_all",
        "agent_budget_holds_owner_all",
        "agent_budget_holds_runtime_all",
        "agent_rate_limits_owner_all",
        "agent_rate_limits_runtime_all",
    ),
    # G16: W3C trace-context ids and the pinned semantic conventions.
    *_entries(
        "G16",
        "agent_tasks_trace_id_format",
        "agent_tasks_span_id_format",
        "agent_operations_trace_id_format",
        "agent_operations_span_id_format",
        "agent_events_trace_id_format",
        "agent_events_span_id_format",
        "agent_outbox_trace_id_format",
        "agent_outbox_span_id_format",
        "agent_semconv_pins_pkey",
        "agent_semconv_pins_version_format",
        "agent_semconv_pins_append_only",
    ),
    # G25: a durable handler's steps, once per task and name, under the task's lease.
    *_entries(
        "G25",
        "agent_steps_pkey",
        "agent_steps_signal_key",
        "agent_steps_guard",
        "agent_steps_waits_valid",
        "agent_steps_owner_all",
        "agent_steps_runtime_all",
        "agent_steps_agent_scope",
    ),
    *_entries("G2", "agent_steps_task_fkey"),
    *_entries("G4", "agent_steps_input_hash_format"),
    *_entries(
        "G5",
        "agent_steps_name_valid",
        "agent_steps_kind_valid",
        "agent_steps_state_valid",
        "agent_steps_lease_token_valid",
    ),
    *_entries("G9", "agent_steps_result_valid", error="PayloadTooLarge"),
    *_entries("G9", "agent_steps_result_no_secrets", error="SecretInPayload"),
    # G20: no message for a cancelled task, whoever writes it.
    *_entries("G20", "agent_outbox_for_open_task"),
    # G17: credentials are references, never secrets.
    *_entries("G17", "agent_credential_refs_is_reference"),
    # Wake-up hints: listeners poll anyway, so nothing is lost without them.
    *_entries(None, "agent_tasks_notify", "agent_outbox_notify", "agent_signals_notify"),
)

#: The rules of the guard triggers that raise more than one SQLSTATE.
RULES: Final[tuple[Rule, ...]] = (
    Rule("agent_tasks_version_guard", "AG002", "G7", "state_version moves by exactly +1"),
    Rule("agent_tasks_version_guard", "AG004", "G2", "tenant_id, id, created_at never change"),
    Rule(
        "agent_tasks_version_guard",
        "AG008",
        "G4",
        "task_type, dedupe_key, input_hash never change",
    ),
    Rule(
        "agent_tasks_version_guard",
        "AG005",
        "G12",
        "lease tokens never go back; every new grant takes a new token",
    ),
    Rule(
        "agent_operations_for_open_task",
        "AG012",
        "G20",
        "no operation for a finished task",
    ),
    Rule(
        "agent_operations_for_open_task",
        "AG013",
        "G21",
        "no operation for a task past its deadline",
    ),
    Rule(
        "agent_operations_for_open_task_retry",
        "AG012",
        "G20",
        "no re-arm for a finished task",
    ),
    Rule(
        "agent_operations_for_open_task_retry",
        "AG013",
        "G21",
        "no re-arm for a task past its deadline",
    ),
    Rule("agent_signals_guard", "AG012", "G20", "no signal to a finished task"),
    Rule("agent_tasks_child_guard", "AG012", "G20", "no new child for a finished task"),
    Rule("agent_signals_guard", "AG013", "G21", "no signal to a task past its deadline"),
    Rule(
        "agent_signals_guard",
        "AG014",
        "G22",
        "no approval by a holder, past or present, of the task's lease",
    ),
    Rule("agent_tasks_child_guard", "AG013", "G21", "no new child for a task past its deadline"),
    Rule("agent_signals_guard", "AG015", "G22", "a signal is placed at READ COMMITTED only"),
    Rule(
        "agent_tasks_signal_guard",
        "AG015",
        "G22",
        "a wait for a signal sleeps only after a look at READ COMMITTED",
    ),
    Rule("agent_tasks_fan_in", "AG016", "G23", "a fan-in counts at READ COMMITTED only"),
    Rule(
        "agent_tasks_children_guard",
        "AG016",
        "G23",
        "a wait for children sleeps only after a count at READ COMMITTED",
    ),
    Rule("agent_steps_guard", "AG018", "G25", "a step is written under the current lease, once"),
    Rule("agent_steps_guard", "AG012", "G20", "no step for a finished task"),
    Rule("agent_steps_guard", "AG013", "G21", "no step for a task past its deadline"),
    Rule("agent_operations_version_guard", "AG002", "G7", "state_version moves by exactly +1"),
    Rule("agent_operations_version_guard", "AG004", "G2", "tenant_id, id, created_at never change"),
    Rule(
        "agent_operations_version_guard",
        "AG008",
        "G4",
        "task_id, idempotency_key, action, input_hash never change",
    ),
)

#: Object name -> its guarantee (for a multi-rule guard: the guarantee of
#: its main rule; :func:`guarantee_of` with the SQLSTATE gives the rule's).
CONSTRAINTS: Final[Mapping[str, str | None]] = MappingProxyType(
    {e.name: e.guarantee for e in CATALOGUE}
)
_RULES: Final[Mapping[tuple[str, str], str]] = MappingProxyType(
    {(r.name, r.sqlstate): r.guarantee for r in RULES}
)


def guarantee_of(name: str | None, sqlstate: str | None = None) -> str | None:
    """The guarantee the object ``name`` enforces with the rule that raised ``sqlstate``.

    ``None`` for names agentdb does not know (and for hints).
    """
    if name is None:
        return None
    if sqlstate is not None:
        found = _RULES.get((name, sqlstate))
        if found is not None:
            return found
    return CONSTRAINTS.get(name)
