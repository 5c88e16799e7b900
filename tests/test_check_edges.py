"""Every CHECK constraint at its edges: the last value it takes and the first it refuses.

test_attacks.py shows each constraint is enforced on a real write (an attack refused, a
control accepted). It does not show *where* the line is: a bound of 100 that became 101, a
`>=` that became `>`, a state dropped from an IN list, or a conjunct dropped from a rule of
several all leave those attacks refused. The mechanical mutants of issue 35
(``python -m dev.mutate --generated``; the `check` units) made exactly those edits and
survived - ``agent_tasks_wait_signal_valid`` 1 -> 2, ``agent_outbox_attempts_valid``
``>=`` -> ``>``, ``agent_steps_kind_valid`` without 'signal', ``agent_schedules_every_valid``
without its one-second floor - so each constraint here is pinned at its edges:

- a length bound: the shortest and longest lengths taken, one shorter and one longer refused;
- a numeric floor or ceiling: the bound taken, one past it refused;
- a list of states or kinds: each member taken, a value outside refused;
- a rule of several conjuncts: for each conjunct, a row only that conjunct refuses.

The expected edges are written here from the guarantees (SPEC.md, the guides), not read from
the schema. Each constraint is checked alone: its definition, as the migrated database holds
it (``pg_get_constraintdef``), is put on an empty copy of its table's columns (no NOT NULL,
no other constraint, no trigger), so a row refused is refused by that constraint and no other,
and Postgres itself decides - a row passes a CHECK that comes out true *or null*, as on the
real table. test_every_check_has_edges ties this list to the schema: a new CHECK without its
edges fails the suite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

from tests.conftest import Database

Row = dict[str, Any]
T0 = "2026-01-01T00:00:00+00:00"
T1 = "2026-01-01T00:05:00+00:00"
PARENT = "7d6f0a8e-3a52-4f43-9d53-0a3e2f7c1b11"
OP = "0b4f1c8e-9d2a-4e8b-8c6f-5a1d2e3f4a5b"
HEX32 = "4bf92f3577b34da6a3ce929d0e0e4736"
HEX16 = "00f067aa0ba902b7"
SHA = "ab" * 32


@dataclass(frozen=True)
class Edge:
    """One CHECK constraint: rows it must take (``ok``) and rows it must refuse (``bad``)."""

    constraint: str
    table: str
    ok: tuple[Row, ...]
    bad: tuple[Row, ...]


def _rows(*parts: Iterable[Row]) -> tuple[Row, ...]:
    return tuple(r for part in parts for r in part)


def length(col: str, lo: int, hi: int, **rest: Any) -> tuple[list[Row], list[Row]]:
    """``length(col) BETWEEN lo AND hi``: lo and hi taken, lo - 1 and hi + 1 refused."""
    ok = [{col: "x" * lo, **rest}, {col: "x" * hi, **rest}]
    bad = [{col: "x" * (hi + 1), **rest}]
    if lo > 0:
        bad.append({col: "x" * (lo - 1), **rest})
    return ok, bad


def at_least(col: str, floor: int | float, step: int | float = 1) -> tuple[list[Row], list[Row]]:
    return [{col: floor}], [{col: floor - step}]


def one_of(col: str, *members: str) -> tuple[list[Row], list[Row]]:
    return [{col: m} for m in members], [{col: "none_of_these"}, {col: members[0].upper()}]


def json_object(col: str, limit: int) -> tuple[list[Row], list[Row]]:
    """A JSON object whose text is at most ``limit`` bytes: the object of exactly ``limit``
    bytes taken, one byte more refused, and a value that is not an object refused."""

    def sized(n: int) -> dict[str, str]:
        # jsonb prints {"a": "..."}: 9 bytes around the string
        doc = {"a": "x" * (n - 9)}
        assert len(json.dumps(doc)) == n
        return doc

    return [{col: sized(limit)}, {col: {}}], [{col: sized(limit + 1)}, {col: ["a"]}, {col: "a"}]


def json_size(col: str, limit: int) -> tuple[list[Row], list[Row]]:
    """Any JSON value of at most ``limit`` bytes."""
    ok, bad = json_object(col, limit)
    return [*ok, {col: ["a"]}], bad[:1]


def hex_id(col: str, digits: int) -> tuple[list[Row], list[Row]]:
    """A W3C trace or span id: ``digits`` lowercase hex digits, not all zeros."""
    good = (HEX32 if digits == 32 else HEX16)[:digits]
    return [{col: good}, {col: "0" * (digits - 1) + "1"}], [
        {col: "0" * digits},
        {col: good[:-1]},
        {col: good + "a"},
        {col: good.upper()},
        {col: "g" * digits},
    ]


def sha256(col: str) -> tuple[list[Row], list[Row]]:
    return [{col: SHA}], [{col: SHA[:-1]}, {col: SHA + "a"}, {col: SHA.upper()}, {col: "g" * 64}]


def edge(constraint: str, table: str, *parts: tuple[list[Row], list[Row]]) -> Edge:
    return Edge(constraint, table, _rows(*(p[0] for p in parts)), _rows(*(p[1] for p in parts)))


def rule(constraint: str, table: str, ok: list[Row], bad: list[Row]) -> Edge:
    return Edge(constraint, table, tuple(ok), tuple(bad))


def per(table: str) -> Edge:
    """A rate limit's window: positive, in days or less (a month or a year has no fixed length)."""
    return rule(
        f"{table}_per_valid",
        table,
        [{"per": "00:00:00.000001"}, {"per": "31 days"}],
        [{"per": "00:00:00"}, {"per": "-1 second"}, {"per": "1 mon"}, {"per": "1 year"}],
    )


def used(table: str) -> list[Edge]:
    return [
        rule(
            f"{table}_used_valid",
            table,
            [{"max_calls": 0, "used": 0}],
            [{"max_calls": -1, "used": 0}, {"max_calls": 0, "used": -1}],
        ),
        rule(
            f"{table}_within_limit",
            table,
            [{"max_calls": 3, "used": 3}, {"max_calls": 3, "used": 0}],
            [{"max_calls": 3, "used": 4}],
        ),
        edge(f"{table}_action_valid", table, length("action", 1, 200)),
    ]


def formats(table: str) -> list[Edge]:
    return [
        edge(f"{table}_trace_id_format", table, hex_id("trace_id", 32)),
        edge(f"{table}_span_id_format", table, hex_id("span_id", 16)),
    ]


SECRET = "sk-" + "A1b2C3d4E5f6G7h8J9k0"
EDGES: tuple[Edge, ...] = (
    # agent_tenants, agent_principals
    edge("agent_tenants_name_valid", "agent_tenants", length("name", 1, 200)),
    edge("agent_tenants_state_valid", "agent_tenants", one_of("state", "active", "deleting")),
    edge("agent_principals_role_name_valid", "agent_principals", length("role_name", 1, 63)),
    rule(
        "agent_transitions_entity_valid",
        "agent_transitions",
        [{"entity": e} for e in ("task", "operation", "outbox")],
        [{"entity": "tasks"}, {"entity": "step"}],
    ),
    rule(
        "agent_transitions_no_self_loop",
        "agent_transitions",
        [{"from_state": "pending", "to_state": "running"}],
        [{"from_state": "pending", "to_state": "pending"}],
    ),
    # agent_tasks
    rule(
        "agent_tasks_attempts_valid",
        "agent_tasks",
        [{"attempts": 0, "max_attempts": 1}, {"attempts": 1, "max_attempts": 1}],
        [
            {"attempts": -1, "max_attempts": 1},
            {"attempts": 0, "max_attempts": 0},
            {"attempts": 2, "max_attempts": 1},
        ],
    ),
    rule(
        "agent_tasks_child_dedupe_reserved",
        "agent_tasks",
        [
            {"dedupe_key": None},
            {"dedupe_key": "order-1"},
            {"dedupe_key": "child"},  # shorter than the reserved prefix
            {"dedupe_key": f"child/{PARENT}/k", "parent_id": PARENT, "child_key": "k"},
        ],
        [
            {"dedupe_key": f"child/{PARENT}/k"},
            {"dedupe_key": f"child/{PARENT}/k", "parent_id": PARENT},
            {"dedupe_key": f"child/{PARENT}/k", "child_key": "k"},
            {"dedupe_key": f"child/{PARENT}/k", "parent_id": PARENT, "child_key": "j"},
            {"dedupe_key": "child/x", "parent_id": PARENT, "child_key": "x"},
        ],
    ),
    edge(
        "agent_tasks_child_key_valid",
        "agent_tasks",
        length("child_key", 1, 200, parent_id=PARENT),
        ([{"child_key": None}], [{"child_key": "k", "parent_id": None}]),
    ),
    edge("agent_tasks_current_step_valid", "agent_tasks", length("current_step", 1, 200)),
    rule(
        "agent_tasks_dedupe_has_hash",
        "agent_tasks",
        [{"dedupe_key": None, "input_hash": None}, {"dedupe_key": "k", "input_hash": SHA}],
        [{"dedupe_key": "k", "input_hash": None}, {"dedupe_key": None, "input_hash": SHA}],
    ),
    edge("agent_tasks_dedupe_key_valid", "agent_tasks", length("dedupe_key", 1, 255)),
    rule(
        "agent_tasks_due_has_wake_at",
        "agent_tasks",
        [
            {"state": "pending", "wake_at": T0},
            {"state": "waiting", "wake_at": T0},
            {"state": "running", "wake_at": None},
            {"state": "succeeded", "wake_at": None},
        ],
        [{"state": "pending", "wake_at": None}, {"state": "waiting", "wake_at": None}],
    ),
    edge("agent_tasks_input_hash_format", "agent_tasks", sha256("input_hash")),
    edge("agent_tasks_last_error_valid", "agent_tasks", length("last_error", 0, 4000)),
    rule(
        "agent_tasks_lease_complete",
        "agent_tasks",
        [
            {"lease_owner": None},
            {"lease_owner": "w", "lease_acquired_at": T0, "lease_expires_at": T1},
        ],
        [
            {"lease_owner": "w", "lease_expires_at": T1},
            {"lease_owner": "w", "lease_acquired_at": T0},
            {"lease_acquired_at": T0, "lease_expires_at": T1},
            {"lease_acquired_at": T0},
        ],
    ),
    edge("agent_tasks_lease_owner_valid", "agent_tasks", length("lease_owner", 1, 200)),
    edge("agent_tasks_lease_token_valid", "agent_tasks", at_least("lease_token", 0)),
    rule(
        "agent_tasks_lease_ttl_valid",
        "agent_tasks",
        [{"lease_ttl": "00:00:01"}, {"lease_ttl": "1 day"}, {"lease_ttl": "24:00:00"}],
        [{"lease_ttl": "00:00:00.999999"}, {"lease_ttl": "1 day 00:00:00.000001"}],
    ),
    rule(
        "agent_tasks_lease_window",
        "agent_tasks",
        [{"lease_acquired_at": T0, "lease_expires_at": "2026-01-01T00:00:00.000001+00:00"}],
        [
            {"lease_acquired_at": T0, "lease_expires_at": T0},
            {"lease_acquired_at": T1, "lease_expires_at": T0},
        ],
    ),
    edge("agent_tasks_params_valid", "agent_tasks", json_object("params", 65536)),
    rule(
        "agent_tasks_running_is_leased",
        "agent_tasks",
        [{"state": "running", "lease_owner": "w"}, {"state": "pending", "lease_owner": None}],
        [{"state": "running", "lease_owner": None}, {"state": "waiting", "lease_owner": "w"}],
    ),
    rule(
        "agent_tasks_schedule_tick_valid",
        "agent_tasks",
        [{"schedule_id": None}, {"schedule_id": PARENT, "schedule_tick": T0}],
        [{"schedule_id": PARENT}, {"schedule_tick": T0}],
    ),
    edge("agent_tasks_signal_cursor_valid", "agent_tasks", at_least("signal_cursor", 0)),
    *formats("agent_tasks"),
    edge(
        "agent_tasks_state_valid",
        "agent_tasks",
        one_of(
            "state", "pending", "waiting", "running", "succeeded", "failed", "cancelled", "dead"
        ),
    ),
    edge("agent_tasks_state_version_valid", "agent_tasks", at_least("state_version", 0)),
    edge("agent_tasks_task_type_valid", "agent_tasks", length("task_type", 1, 200)),
    edge("agent_tasks_wait_children_valid", "agent_tasks", at_least("wait_children", 1)),
    edge("agent_tasks_wait_signal_valid", "agent_tasks", length("wait_signal", 1, 100)),
    edge("agent_tasks_workflow_version_valid", "agent_tasks", length("workflow_version", 1, 100)),
    edge(
        "agent_concurrency_limits_max_running_valid",
        "agent_concurrency_limits",
        at_least("max_running", 0),
    ),
    edge(
        "agent_concurrency_limits_task_type_valid",
        "agent_concurrency_limits",
        length("task_type", 1, 200),
    ),
    # agent_operations, agent_artifacts, agent_credential_refs
    edge("agent_operations_action_valid", "agent_operations", length("action", 1, 200)),
    edge("agent_operations_attempts_valid", "agent_operations", at_least("attempts", 1)),
    edge("agent_operations_error_valid", "agent_operations", length("error", 0, 4000)),
    edge(
        "agent_operations_idempotency_key_valid",
        "agent_operations",
        length("idempotency_key", 1, 255),
    ),
    edge("agent_operations_input_hash_format", "agent_operations", sha256("input_hash")),
    edge(
        "agent_operations_provider_reference_valid",
        "agent_operations",
        length("provider_reference", 1, 500),
    ),
    edge("agent_operations_result_valid", "agent_operations", json_size("result", 65536)),
    *formats("agent_operations"),
    edge(
        "agent_operations_state_valid",
        "agent_operations",
        one_of("state", "reserved", "in_flight", "succeeded", "failed", "unknown"),
    ),
    edge("agent_operations_state_version_valid", "agent_operations", at_least("state_version", 0)),
    rule(
        "agent_operations_succeeded_has_no_error",
        "agent_operations",
        [
            {"state": "succeeded", "error": None},
            {"state": "failed", "error": "boom"},
            {"state": "unknown", "error": "lost"},
        ],
        [{"state": "succeeded", "error": "boom"}, {"state": "succeeded", "error": ""}],
    ),
    edge("agent_artifacts_content_type_valid", "agent_artifacts", length("content_type", 1, 200)),
    edge("agent_artifacts_kind_valid", "agent_artifacts", length("kind", 1, 100)),
    edge("agent_artifacts_sha256_format", "agent_artifacts", sha256("sha256")),
    edge("agent_artifacts_size_valid", "agent_artifacts", at_least("size_bytes", 0)),
    rule(
        "agent_artifacts_uri_valid",
        "agent_artifacts",
        [{"uri": "s3://bucket/key"}, {"uri": "https://" + "x" * 1992}],
        [{"uri": "https://" + "x" * 1993}, {"uri": "bucket/key"}, {"uri": "s3://a b"}],
    ),
    rule(
        "agent_credential_refs_is_reference",
        "agent_credential_refs",
        [{"secret_ref": "vault://kv/openai"}, {"secret_ref": "env://" + "X" * 494}],
        [
            {"secret_ref": "env://" + "X" * 495},
            {"secret_ref": "OPENAI_API_KEY"},
            {"secret_ref": f"env://{SECRET}"},
        ],
    ),
    edge("agent_credential_refs_name_valid", "agent_credential_refs", length("name", 1, 200)),
    edge(
        "agent_credential_refs_provider_valid", "agent_credential_refs", length("provider", 1, 100)
    ),
    # agent_events
    edge("agent_events_actor_id_valid", "agent_events", length("actor_id", 1, 200)),
    edge("agent_events_event_type_valid", "agent_events", length("event_type", 1, 200)),
    rule(
        "agent_events_operation_version_has_operation",
        "agent_events",
        [
            {"operation_state_version": None, "operation_id": None},
            {"operation_state_version": 0, "operation_id": OP},
        ],
        [{"operation_state_version": 0, "operation_id": None}],
    ),
    rule(
        "agent_events_payload_no_secrets",
        "agent_events",
        [
            {"payload": {"note": "a password reset was sent"}},
            {"payload": {"api_key": "[redacted]"}},
        ],
        [{"payload": {"api_key": "hunter2"}}, {"payload": {"note": SECRET}}],
    ),
    edge("agent_events_payload_size", "agent_events", json_object("payload", 8192)),
    edge("agent_events_policy_version_valid", "agent_events", length("policy_version", 1, 100)),
    rule(
        "agent_events_retention_order",
        "agent_events",
        [
            {"payload_expires_at": T0, "retain_until": T0},
            {"payload_expires_at": T0, "retain_until": T1},
        ],
        [{"payload_expires_at": T1, "retain_until": T0}],
    ),
    *formats("agent_events"),
    edge(
        "agent_events_state_valid",
        "agent_events",
        length("from_state", 0, 50),
        length("to_state", 0, 50),
    ),
    # agent_outbox, agent_inbox
    rule(
        "agent_outbox_attempts_valid",
        "agent_outbox",
        [{"attempts": 0, "max_attempts": 1}, {"attempts": 5, "max_attempts": 1}],
        [{"attempts": -1, "max_attempts": 1}, {"attempts": 0, "max_attempts": 0}],
    ),
    rule(
        "agent_outbox_delivered_at_valid",
        "agent_outbox",
        [{"state": "delivered", "delivered_at": T0}, {"state": "pending", "delivered_at": None}],
        [{"state": "delivered", "delivered_at": None}, {"state": "dead", "delivered_at": T0}],
    ),
    edge("agent_outbox_last_error_valid", "agent_outbox", length("last_error", 0, 4000)),
    edge("agent_outbox_lease_owner_valid", "agent_outbox", length("lease_owner", 1, 200)),
    edge("agent_outbox_lease_token_valid", "agent_outbox", at_least("lease_token", 0)),
    edge("agent_outbox_payload_size", "agent_outbox", json_object("payload", 65536)),
    *formats("agent_outbox"),
    edge(
        "agent_outbox_state_valid", "agent_outbox", one_of("state", "pending", "delivered", "dead")
    ),
    edge("agent_outbox_topic_valid", "agent_outbox", length("topic", 1, 200)),
    edge("agent_inbox_consumer_valid", "agent_inbox", length("consumer", 1, 200)),
    # agent_signals
    rule(
        "agent_signals_decision_valid",
        "agent_signals",
        [
            {"kind": "approval", "decision": "approved"},
            {"kind": "approval", "decision": "rejected"},
            {"kind": "signal", "decision": None},
        ],
        [
            {"kind": "approval", "decision": None},
            {"kind": "signal", "decision": "approved"},
            {"kind": "approval", "decision": "maybe"},
        ],
    ),
    rule(
        "agent_signals_dedupe_has_hash",
        "agent_signals",
        [{"dedupe_key": None, "input_hash": None}, {"dedupe_key": "k", "input_hash": SHA}],
        [{"dedupe_key": "k", "input_hash": None}, {"dedupe_key": None, "input_hash": SHA}],
    ),
    edge("agent_signals_dedupe_key_valid", "agent_signals", length("dedupe_key", 1, 255)),
    edge("agent_signals_input_hash_format", "agent_signals", sha256("input_hash")),
    edge("agent_signals_kind_valid", "agent_signals", one_of("kind", "signal", "approval")),
    edge("agent_signals_name_valid", "agent_signals", length("name", 1, 100)),
    edge("agent_signals_payload_valid", "agent_signals", json_object("payload", 65536)),
    edge("agent_signals_sender_valid", "agent_signals", length("sender", 1, 200)),
    edge("agent_signals_seq_valid", "agent_signals", at_least("seq", 1)),
    # agent_schedules
    rule(
        "agent_schedules_anchor_valid",
        "agent_schedules",
        [{"anchor": T0}],
        [{"anchor": "2026-01-01T00:00:00.5+00:00"}],
    ),
    edge("agent_schedules_catch_up_valid", "agent_schedules", one_of("catch_up", "latest", "all")),
    rule(
        "agent_schedules_cron_valid",
        "agent_schedules",
        [{"cron": "*/5 * * * *"}, {"cron": "0 9 * * 1-5"}],
        [{"cron": "*/5 * * *"}, {"cron": "60 * * * *"}, {"cron": "every minute"}],
    ),
    rule(
        "agent_schedules_every_valid",
        "agent_schedules",
        [{"every": "00:00:01"}, {"every": "30 days"}],
        [
            {"every": "00:00:00"},  # only the one-second floor refuses it
            {"every": "00:00:00.999999"},
            {"every": "1 mon"},  # only the month part
            {"every": "1 year"},  # only the year part
            {"every": "00:00:01.5"},  # only the whole seconds
        ],
    ),
    edge("agent_schedules_name_valid", "agent_schedules", length("name", 1, 200)),
    rule(
        "agent_schedules_next_tick_valid",
        "agent_schedules",
        [
            {"every": "00:01:00", "anchor": T0, "next_tick_at": T1},
            {"cron": "*/5 * * * *", "anchor": T0, "next_tick_at": T1},
        ],
        [
            {"every": "00:01:00", "anchor": T0, "next_tick_at": "2026-01-01T00:05:30+00:00"},
            {"cron": "*/5 * * * *", "anchor": T0, "next_tick_at": "2026-01-01T00:06:00+00:00"},
            {"cron": "*/5 * * * *", "anchor": T1, "next_tick_at": T0},  # before the anchor
        ],
    ),
    rule(
        "agent_schedules_one_rule",
        "agent_schedules",
        [{"every": "00:01:00"}, {"cron": "* * * * *"}],
        [{}, {"every": "00:01:00", "cron": "* * * * *"}],
    ),
    edge("agent_schedules_params_valid", "agent_schedules", json_object("params", 65536)),
    rule(
        "agent_schedules_task_deadline_valid",
        "agent_schedules",
        [{"task_deadline": "00:00:00.000001"}],
        [{"task_deadline": "00:00:00"}, {"task_deadline": "-1 second"}],
    ),
    edge("agent_schedules_task_type_valid", "agent_schedules", length("task_type", 1, 200)),
    edge(
        "agent_schedules_workflow_version_valid",
        "agent_schedules",
        length("workflow_version", 1, 100),
    ),
    # agent_steps
    edge("agent_steps_input_hash_format", "agent_steps", sha256("input_hash")),
    edge(
        "agent_steps_kind_valid",
        "agent_steps",
        one_of("kind", "step", "signal", "sleep", "children"),
    ),
    edge("agent_steps_lease_token_valid", "agent_steps", at_least("lease_token", 1)),
    edge("agent_steps_name_valid", "agent_steps", length("name", 1, 200)),
    rule(
        "agent_steps_result_no_secrets",
        "agent_steps",
        [{"result": {"receipt": "r-1"}}, {"result": {"password": "[redacted]"}}],
        [{"result": {"password": "hunter2"}}, {"result": [SECRET]}],
    ),
    edge("agent_steps_result_valid", "agent_steps", json_size("result", 65536)),
    edge("agent_steps_state_valid", "agent_steps", one_of("state", "waiting", "done")),
    rule(
        "agent_steps_waits_valid",
        "agent_steps",
        [
            {"state": "done", "kind": "step"},
            {"state": "waiting", "kind": "signal"},
            {"state": "waiting", "kind": "children"},
            {"state": "waiting", "kind": "sleep", "wake_at": T0},
            {"state": "done", "kind": "signal", "signal_seq": 1},
            {"state": "waiting", "kind": "signal", "wake_at": T0},
            {"state": "done", "kind": "sleep", "wake_at": T0},
        ],
        [
            {"state": "waiting", "kind": "step"},  # only a wait may wait
            {"state": "waiting", "kind": "signal", "signal_seq": 1},  # a taken signal is done
            {"state": "done", "kind": "step", "signal_seq": 1},  # only a signal takes one
            {"state": "done", "kind": "step", "wake_at": T0},  # only a sleep or signal wakes
            {"state": "waiting", "kind": "children", "wake_at": T0},
            {"state": "waiting", "kind": "sleep"},  # a sleep has its wake time
        ],
    ),
    # agent_budgets, agent_budget_holds, rate limits
    rule(
        "agent_budgets_amounts_valid",
        "agent_budgets",
        [{"limit_amount": 0, "spent": 0, "held": 0}],
        [
            {"limit_amount": -1, "spent": 0, "held": 0},
            {"limit_amount": 0, "spent": -1, "held": 0},
            {"limit_amount": 0, "spent": 0, "held": -1},
        ],
    ),
    edge("agent_budgets_period_valid", "agent_budgets", one_of("period", "total", "day", "month")),
    rule(
        "agent_budgets_unit_valid",
        "agent_budgets",
        [{"unit": "usd"}, {"unit": "a"}, {"unit": "t" + "_9" * 31}],
        [{"unit": "t" + "x" * 63}, {"unit": "USD"}, {"unit": "9usd"}, {"unit": ""}],
    ),
    rule(
        "agent_budgets_within_limit",
        "agent_budgets",
        [{"limit_amount": 5, "spent": 2, "held": 3}],
        [{"limit_amount": 5, "spent": 3, "held": 3}, {"limit_amount": 5, "spent": 6, "held": 0}],
    ),
    rule(
        "agent_budget_holds_amount_valid",
        "agent_budget_holds",
        [{"amount": 0, "attempt": 1}],
        [{"amount": -1, "attempt": 1}, {"amount": 0, "attempt": 0}],
    ),
    rule(
        "agent_budget_holds_settled_valid",
        "agent_budget_holds",
        [
            {"state": "held", "settled": None, "amount": 5},
            {"state": "released", "settled": None, "amount": 5},
            {"state": "settled", "settled": 0, "amount": 5},
            {"state": "settled", "settled": 5, "amount": 5},
        ],
        [
            {"state": "settled", "settled": None, "amount": 5},
            {"state": "held", "settled": 0, "amount": 5},
            {"state": "settled", "settled": -1, "amount": 5},
            {"state": "settled", "settled": 6, "amount": 5},
        ],
    ),
    edge(
        "agent_budget_holds_state_valid",
        "agent_budget_holds",
        one_of("state", "held", "settled", "released"),
    ),
    per("agent_rate_limits"),
    *used("agent_rate_limits"),
    per("agent_global_rate_limits"),
    *used("agent_global_rate_limits"),
    rule(
        "agent_semconv_pins_version_format",
        "agent_semconv_pins",
        [{"version": "1.37"}, {"version": "1.37.0"}, {"version": "1.38.0-dev"}],
        [{"version": "1"}, {"version": "v1.37"}, {"version": "1.37."}, {"version": "1.37.0 "}],
    ),
)
BY_NAME = {e.constraint: e for e in EDGES}
_IDENT = re.compile(r"^[a-z0-9_]+$")  # catalog names, checked before they are spliced


async def _checks(conn: asyncpg.Connection) -> dict[str, tuple[str, str]]:
    """The schema's CHECK constraints: name -> (table, definition)."""
    rows = await conn.fetch(
        "SELECT c.conname, r.relname, pg_get_constraintdef(c.oid) AS def"
        " FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid"
        " WHERE c.contype = 'c' AND r.relnamespace = current_schema()::regnamespace"
        "   AND r.relkind IN ('r', 'p')"
    )
    return {r["conname"]: (r["relname"], r["def"]) for r in rows}


async def _verdict(conn: asyncpg.Connection, row: Row) -> str | None:
    """Insert ``row`` into the copy: None when taken, else the constraint that refused it."""
    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the copy usable
            await conn.execute(
                "INSERT INTO edge_copy"
                " SELECT * FROM jsonb_populate_record(NULL::edge_copy, $1::jsonb)",
                json.dumps(row),
            )
    except asyncpg.CheckViolationError as e:
        return e.constraint_name or "?"
    return None


async def test_G5_every_check_takes_its_edge_and_refuses_one_past_it(db: Database) -> None:
    """Each constraint's ``ok`` rows are taken and each ``bad`` row is refused by it.

    Fails on the generated `check` mutants that moved a bound by one, flipped a comparison,
    dropped a list member or dropped a conjunct (issue 35: e.g. `agent_tasks_wait_signal_valid
    -int-1`, `agent_outbox_attempts_valid-cmp-2`, `agent_steps_kind_valid-list-2`,
    `agent_schedules_every_valid-and-1`).
    """
    conn = await db.connect()
    wrong: list[str] = []
    try:
        checks = await _checks(conn)
        for e in EDGES:
            assert e.constraint in checks, f"{e.constraint}: no such CHECK in the schema"
            table, definition = checks[e.constraint]
            assert table == e.table, f"{e.constraint} is on {table}, not {e.table}"
            assert _IDENT.match(table), table
            assert _IDENT.match(e.constraint), e.constraint
            async with conn.transaction():
                await conn.execute(
                    f"CREATE TEMP TABLE edge_copy AS SELECT * FROM {table} WHERE false"  # noqa: S608 - a catalog name
                )
                await conn.execute(
                    f"ALTER TABLE edge_copy ADD CONSTRAINT {e.constraint} {definition}"
                )
                for row in e.ok:
                    if (got := await _verdict(conn, row)) is not None:
                        wrong.append(f"{e.constraint}: {row} refused by {got}, must be taken")
                for row in e.bad:
                    if (got := await _verdict(conn, row)) != e.constraint:
                        wrong.append(f"{e.constraint}: {row} taken, must be refused")
                await conn.execute("DROP TABLE edge_copy")
    finally:
        await conn.close()
    assert not wrong, "\n".join(wrong)


async def test_every_check_has_edges(db: Database) -> None:
    """A CHECK added to the schema without its edges here fails, and so does a stale entry;
    each entry has a row taken and a row refused, so none passes by having nothing to try."""
    conn = await db.connect()
    try:
        checks = await _checks(conn)
    finally:
        await conn.close()
    assert sorted(set(checks) - set(BY_NAME)) == []
    assert sorted(set(BY_NAME) - set(checks)) == []
    assert len(BY_NAME) == len(EDGES), "a constraint listed twice"
    assert all(e.ok and e.bad for e in EDGES)
