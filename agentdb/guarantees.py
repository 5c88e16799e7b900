"""The guarantees (G1, G2, ... in order), and (re-exported from :mod:`agentdb.catalogue`) the
catalogue that ties every schema object to one of them.

One registry, read by everything that names a guarantee: the error classes
(``.guarantee``), the audit's verdicts, the README's tables (generated from
here, ``make readme``), and the tests that keep the thread true
(``tests/test_thread.py``): every ``-- Gn`` comment beside a constraint,
trigger or index in ``sql/`` equals its entry here, every statement header in
``agentdb/queries`` names a known guarantee, and every attack on an object
asserts the error class and guarantee its refusal maps to.

Names in :data:`CATALOGUE` are public API: errors map on them. An object
with one rule has one guarantee. A guard trigger that raises several
SQLSTATEs has one :class:`Rule` per SQLSTATE, each with its own guarantee
(the version guard refuses a version skip for G7, an identity change for
G2, a rebound key for G4 and a recycled lease token for G12).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from agentdb.catalogue import CATALOGUE, CONSTRAINTS, RULES, Entry, Rule, guarantee_of

__all__ = [
    "CATALOGUE",
    "CONSTRAINTS",
    "GUARANTEES",
    "RULES",
    "Entry",
    "Guarantee",
    "Rule",
    "guarantee_of",
]


@dataclass(frozen=True, slots=True)
class Guarantee:
    """One guarantee: a stable id, a short title, and the promise in one sentence."""

    id: str
    title: str
    statement: str
    enforced_by: str


GUARANTEES: Final[Mapping[str, Guarantee]] = MappingProxyType(
    {
        g.id: g
        for g in (
            Guarantee(
                "G1",
                "tasks and operations are separate",
                "Tasks (the workflow) and operations (one effect a task attempts) are separate "
                "tables; a task may retry one operation or wait between operations.",
                "tables agent_tasks and agent_operations; edge operation failed -> reserved; "
                "task state waiting + wake_at",
            ),
            Guarantee(
                "G2",
                "no row points at another tenant's row",
                "No row of a tenant-owned child table can point at another tenant's row, and "
                "a row's tenant and identity never change.",
                "composite foreign keys (tenant_id, x_id); tenant-leading keys; the version "
                "guards (AG004)",
            ),
            Guarantee(
                "G3",
                "one operation per key per tenant",
                "Two workers cannot create the same logical operation (or the same task of a "
                "dedupe key) twice.",
                "UNIQUE (tenant_id, idempotency_key), UNIQUE (tenant_id, dedupe_key)",
            ),
            Guarantee(
                "G4",
                "a key carries the hash of its request",
                "Reusing a key with different parameters is refused, never answered with the "
                "old result; same key and parameters returns the stored result; a key still "
                "in flight is a distinct, typed answer.",
                "stored input_hash compared by the runtime; the version guards keep a key "
                "bound to its request (AG008)",
            ),
            Guarantee(
                "G5",
                "states and owners are always valid",
                "State values, ownership, lease and counter columns are always valid.",
                "NOT NULL and named CHECKs (they hold with triggers switched off)",
            ),
            Guarantee(
                "G6",
                "lifecycle moves only along allowed edges",
                "A task's, operation's or message's state only moves along allowed edges.",
                "agent_transitions + the transition guards (AG001)",
            ),
            Guarantee(
                "G7",
                "every state write moves a version",
                "Every state write is conditional on the version the writer read and moves it "
                "by exactly +1; a stale writer touches nothing and gets a typed error.",
                "the version guards (AG002); WHERE state_version = $expected in every "
                "statement; the row-count contract",
            ),
            Guarantee(
                "G8",
                "state changes are audited, append-only",
                "Every state change writes its audit event in the same transaction; the event "
                "table is append-only.",
                "deferred event triggers (AG006); unique event versions; the append-only "
                "guard (AG003); no UPDATE/DELETE grants",
            ),
            Guarantee(
                "G9",
                "payloads bounded, secret-free, retained",
                "Payloads never carry secrets or unbounded responses; payload retention is "
                "separate from the audit skeleton.",
                "size and secret CHECKs; redaction in the write path; retention columns and "
                "agentdb_purge",
            ),
            Guarantee(
                "G10",
                "outbox delivery is queryable",
                "Downstream delivery survives a crash between commit and publish: the outbox "
                "row commits with the change, the relay publishes and marks it, delivery state "
                "is queryable.",
                "agent_outbox written in the caller's transaction; the relay's fenced claim "
                "and mark",
            ),
            Guarantee(
                "G11",
                "consumers can deduplicate redeliveries",
                "The relay may publish twice; consumers deduplicate on the stable message id.",
                "stable agent_outbox.id; agent_inbox primary key",
            ),
            Guarantee(
                "G12",
                "fenced leases",
                "A worker owns a task through a lease it renews; once taken over it cannot "
                "write: every holder's write names its lease token.",
                "lease columns and CHECKs; tokens grow with every grant (AG005); "
                "owner + token in every holder's WHERE",
            ),
            Guarantee(
                "G13",
                "unsettled operations are findable",
                "No transaction stays open across a provider call; an operation whose outcome "
                "is unknown is visible as such and is reconciled, never blindly re-run.",
                "reserve commits before the call; operation states reserved / in_flight / "
                "unknown; the unsettled index",
            ),
            Guarantee(
                "G14",
                "policy facts are typed columns",
                "Facts used for authorization, scheduling, retention or policy are typed "
                "columns; JSONB only for model metadata and step-local values.",
                "the schema's columns (agentdb audit flags JSON paths in indexes and policies)",
            ),
            Guarantee(
                "G15",
                "RLS and roles scope agents to a tenant",
                "Agents never get an admin connection: a restricted role runs approved "
                "statements only, scoped to one tenant by row-level security.",
                "roles, GRANTs, forced RLS policies, agentdb_request_task (AG007)",
            ),
            Guarantee(
                "G16",
                "trace and span ids",
                "Tasks, operations, events and messages carry valid W3C trace and span ids; the "
                "GenAI semantic-conventions version is pinned.",
                "format CHECKs; the append-only agent_semconv_pins",
            ),
            Guarantee(
                "G17",
                "tenant deletion policy, credential refs",
                "Deleting a tenant follows an explicit, tested policy; credentials are "
                "references, never secrets.",
                "agentdb_delete_tenant (dry run and real run); "
                "agent_credential_refs_is_reference; RESTRICT foreign keys",
            ),
            Guarantee(
                "G18",
                "fair claiming, per-tenant concurrency caps",
                "A tenant's backlog cannot starve the others: workers share each claim "
                "round-robin between the tenants with due work; and no tenant (or task type of "
                "a tenant) ever runs more tasks at once than its cap.",
                "lease_claim (round-robin walk over agent_tasks_due_idx); "
                "agent_concurrency_limits + the trigger agent_tasks_concurrency_guard (AG009)",
            ),
            Guarantee(
                "G19",
                "spend budgets and rate limits refused at reserve",
                "A reservation that would take a tenant's (or a task's) spent plus held amount "
                "over its budget, or an action over its rate limit, is refused when the "
                "operation is reserved; settling spends at most what was held.",
                "CHECK agent_budgets_within_limit on holds taken by operation_reserve; "
                "agent_budget_holds; the trigger agent_operations_rate_limit and CHECK "
                "agent_rate_limits_within_limit; the guards agent_budgets_guard and "
                "agent_budget_holds_guard (AG010)",
            ),
            Guarantee(
                "G20",
                "a cancel is final",
                "Cancelling a task takes its lease away in the same write, so the holder's "
                "next renew, reserve, settle or finish is refused; nothing is reserved or "
                "re-armed for a finished task, and what was reserved before stays in the "
                "ledger to be reconciled.",
                "tasks.cancel (one versioned write with its event, dropping the lease); no "
                "edge out of 'cancelled' in agent_transitions; the triggers "
                "agent_operations_for_open_task, agent_operations_for_open_task_retry, "
                "agent_steps_guard and agent_outbox_for_open_task (AG012)",
            ),
            Guarantee(
                "G21",
                "a deadline is final",
                "After a task's deadline no claim takes it, no write keeps it alive - no "
                "finish, step or release - and no new operation starts for it; the sweep moves "
                "it to dead with its event, dropping the lease of a worker still running it, "
                "and a passed deadline never moves.",
                "the trigger agent_tasks_deadline_guard (AG013) and the deadline rule of "
                "agent_operations_for_open_task (AG013); the claim's deadline filter; the sweep "
                "lease_expire_deadlines over agent_tasks_deadline_idx",
            ),
            Guarantee(
                "G22",
                "a signal arrives once, in order",
                "A signal or approval is recorded once per dedupe key, in the task's own "
                "order, in the audit trail, and wakes the task waiting for it as it commits - "
                "even one that began waiting a moment later; a task reads each signal once; "
                "no signal reaches a finished task, and no agent approves its own work.",
                "agent_signals_seq_key with the task lock of agent_signals_guard (AG012, "
                "AG014, AG015 outside READ COMMITTED), after agent_signals_access (the task "
                "looked for as the sender); agent_signals_deliver (events, wake-up); "
                "agent_tasks_signal_guard (the cursor, AG014; a wait for a signal already "
                "there; AG015); agent_signals_immutable (AG003); the policies "
                "agent_signals_agent_send and agent_signals_task_fkey",
            ),
            Guarantee(
                "G23",
                "a parent is woken once by its children",
                "A child task is in its parent's tenant and created once per key, never for a "
                "finished parent; a parent waiting for its children (all, or a quorum) is woken "
                "exactly once, when the last of them finishes - however many finish at once, "
                "and even if the wait began after they did.",
                "agent_tasks_parent_fkey (tenant_id, parent_id), agent_tasks_child_key, "
                "agent_tasks_child_dedupe_reserved, the trigger agent_tasks_child_guard "
                "(AG012, AG013); agent_tasks_fan_in (the parent row locked, then its finished "
                "children counted; AG016 outside READ COMMITTED); agent_tasks_children_guard "
                "(AG016)",
            ),
            Guarantee(
                "G24",
                "a schedule fires once per tick",
                "A schedule creates at most one task per tick of its rule, however many "
                "schedulers fire it at once; a tick is one of the rule's and already due; after "
                "downtime its catch-up policy decides what fires, and a paused schedule fires "
                "nothing.",
                "agent_tasks_schedule_tick_key (tenant_id, schedule_id, schedule_tick); the "
                "trigger agent_tasks_schedule_guard (AG017: a due tick of a schedule of the "
                "task's tenant) and agent_tasks_schedule_fixed; agentdb_fire_schedule (the "
                "schedule row locked, SKIP LOCKED); agent_schedules_next_tick_valid",
            ),
            Guarantee(
                "G25",
                "a step is recorded once, under its lease",
                "A durable handler's step is recorded once per task and name, only under the "
                "task's current lease and while the task runs within its deadline; a recorded "
                "step never changes (a wait is finished once), its arguments' hash is bound to "
                "its name, and a signal is taken by one step at most - so a re-entered handler "
                "replays what was recorded and never another call's result.",
                "agent_steps_pkey (tenant_id, task_id, name); agent_steps_signal_key; the "
                "trigger agent_steps_guard (AG018; AG012, AG013); the lease fence of "
                "step_insert, step_finish and step_take_signal; agent_steps_result_valid and "
                "agent_steps_result_no_secrets (G9)",
            ),
        )
    }
)
