-- The runtime's statements on Citus (agentdb._citus.routed).
--
-- On a distributed schema every hot-path write is for one tenant, and each
-- statement here names that tenant ($1) on every table it touches, so
-- Citus routes it whole to the one worker that holds the tenant's shards.
-- A task's claim, its events and its outbox rows then commit on that
-- worker in one transaction without two-phase commit. The one-statement
-- forms of the plain runtime cannot be routed: Citus plans an INSERT inside
-- a WITH through the coordinator, copies its rows, and then always commits
-- with two-phase commit. So here a write is an UPDATE ... RETURNING (its
-- WITH clauses only read and lock), followed by one single-row INSERT per
-- event or message, sent together (agentdb._db.execute_each).

-- name: routed_budget_hold :many
-- Hold cost ($3 units, $4 amounts) on every budget of tenant $1 of those
-- units that covers the tenant or task $2 (G19), for a reservation made in
-- this transaction; the caller then writes one hold row per budget
-- (routed_budget_hold_row). The CHECK agent_budgets_within_limit refuses a
-- hold over a limit, and the caller's transaction with it. One row per
-- budget held; none when no budget covers these units.
-- guarantee: G19
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 units text[], $4 amounts int8[]
UPDATE agent_budgets b
SET held = b.held + c.amount, updated_at = now()
FROM unnest($3::text[], $4::int8[]) AS c (unit, amount)
WHERE b.tenant_id = $1 AND b.unit = c.unit AND (b.task_id IS NULL OR b.task_id = $2)
RETURNING b.id AS budget_id, b.unit, c.amount;

-- name: routed_budget_hold_row :execrows
-- One hold of attempt $3 of tenant $1's operation $2 on budget $4 (G19),
-- beside the budget update that took it (routed_budget_hold).
-- guarantee: G19
-- zero rows: never; the insert either writes its row or raises.
-- params: $1 tenant_id uuid, $2 operation_id uuid, $3 attempt int4, $4 budget_id uuid, $5 unit text, $6 amount int8
INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id, unit, amount)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: routed_budget_lock :many
-- Lock tenant $1's budgets of units $3 that cover the tenant or task $2
-- (G19), in id order, before a reservation inserts its operation. The
-- insert's trigger locks the action's rate limit (agentdb_count_call), and
-- budgets are always locked before rate limits - as operation_reserve and
-- the re-arm of a failed operation's retry lock them - and, on Citus, in id
-- order (the re-arm takes this lock too), so a reservation and a re-armed
-- retry of the same tenant never wait for each other's locks in opposite
-- orders (a deadlock, one of them lost). One row per budget locked.
-- guarantee: G19
-- zero rows: no budget of those units covers the task (nothing will be held).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 units text[]
SELECT b.id
FROM agent_budgets b
WHERE b.tenant_id = $1 AND b.unit = ANY ($3::text[]) AND (b.task_id IS NULL OR b.task_id = $2)
ORDER BY b.id
FOR UPDATE;

-- name: routed_budget_settle :execrows
-- Move tenant $1's budgets by the holds routed_budget_settle_holds settled:
-- spent + the settled amounts, held - the held ones (G19).
-- guarantee: G19
-- zero rows: no budget named (the caller passes only budgets it just settled holds of).
-- params: $1 tenant_id uuid, $2 budget_ids uuid[], $3 amounts int8[], $4 settled int8[]
UPDATE agent_budgets b
SET spent = b.spent + x.settled, held = b.held - x.amount, updated_at = now()
FROM unnest($2::uuid[], $3::int8[], $4::int8[]) AS x (id, amount, settled)
WHERE b.tenant_id = $1 AND b.id = x.id;

-- name: routed_budget_settle_holds :many
-- The holds part of operation_settle (operations.sql) for tenant $1's
-- operation $2, which moved to $3 in this transaction: succeeded spends the
-- actual cost ($4 units, $5 amounts; a unit not named spends its whole
-- hold), failed releases. The caller then moves the budgets
-- (routed_budget_settle). One row per hold settled.
-- guarantee: G19
-- params: $1 tenant_id uuid, $2 operation_id uuid, $3 to_state text, $4 units text[], $5 amounts int8[]
UPDATE agent_budget_holds h
SET state = CASE WHEN $3 = 'succeeded' THEN 'settled' ELSE 'released' END,
    settled = CASE WHEN $3 = 'succeeded' THEN coalesce(
        (SELECT a.amount FROM unnest($4::text[], $5::int8[]) AS a (unit, amount)
         WHERE a.unit = h.unit), h.amount) END
WHERE h.tenant_id = $1 AND h.operation_id = $2 AND h.state = 'held'
  AND $3 IN ('succeeded', 'failed')
RETURNING h.budget_id, h.unit, h.amount, h.settled;

-- name: routed_bury :many
-- Tenant $1's tasks that used up their attempts and are not held by a live
-- lease, moved to 'dead' (at most $3). The caller writes their events.
-- guarantee: G6, G8
-- zero rows: nothing of this tenant is exhausted (or another worker is burying it).
-- params: $1 tenant_id uuid, $2 batch int8
WITH victims AS MATERIALIZED (
    SELECT t.id, t.state AS from_state
    FROM agent_tasks t
    WHERE t.tenant_id = $1 AND t.attempts >= t.max_attempts
      AND ((t.state = 'running' AND t.lease_expires_at <= now())
           OR (t.state IN ('pending', 'waiting') AND t.wake_at <= now()))
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_tasks t
SET state = 'dead', state_version = t.state_version + 1, lease_owner = NULL,
    lease_acquired_at = NULL, lease_expires_at = NULL, updated_at = now()
FROM victims v
WHERE t.tenant_id = $1 AND t.id = v.id
RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.attempts,
          t.trace_id, t.span_id, v.from_state;

-- name: routed_claim :many
-- Lease up to $3 of tenant $1's due tasks to worker $2, each claim with its
-- event (task.claimed or task.reclaimed): running tasks whose lease expired
-- first, then pending/waiting ones in wake_at order, never beyond the
-- tenant's caps (G18). One call of agentdb_routed_claim()
-- (0021.delegated_writes), whose statement this one was: Citus sends it
-- whole to the tenant's node when it is made outside a transaction block.
-- The caps are locked FOR UPDATE SKIP LOCKED; if another claimer holds any
-- of them this claim takes no new task (it may still recover expired ones,
-- which do not change how many run).
-- guarantee: G18, G12, G7, G8
-- zero rows: nothing of this tenant is due that this worker may take, or its caps are full or held by another claimer.
-- params: $1 tenant_id uuid, $2 lease_owner text, $3 batch int8, $4 lease_ttl interval, $5 task_types text[]
SELECT c.id, c.tenant_id, c.task_type, c.workflow_version, c.state, c.state_version,
       c.current_step, c.wake_at, c.dedupe_key, c.input_hash, c.params, c.attempts,
       c.max_attempts, c.last_error, c.lease_ttl, c.lease_owner, c.lease_token,
       c.lease_acquired_at, c.lease_expires_at, c.deadline_at, c.trace_id, c.span_id,
       c.created_at, c.updated_at, c.from_state, c.ord
FROM agentdb_routed_claim($1, $2, $3, $4, $5) c;

-- name: routed_deadline_tenants :many
-- Tenants with an unfinished task whose deadline has passed: where
-- routed_expire_deadlines has work. A lock-free read.
-- guarantee: G21
-- params: $1 max_tenants int8
SELECT DISTINCT t.tenant_id
FROM agent_tasks t
WHERE t.deadline_at <= now() AND t.deadline_at IS NOT NULL
  AND t.state IN ('pending', 'waiting', 'running')
ORDER BY t.tenant_id
LIMIT $1;

-- name: routed_due_tenants :many
-- Up to $2 tenants with a task a worker may take now (due, or running under
-- an expired lease, and not past its deadline: G21), in walk order: the
-- tenants after $1 by id, then from the first - the wrap in the same
-- statement. A lock-free read that Citus runs on every shard at once, one
-- index probe per tenant; the claim per tenant (routed_claim) locks. The
-- worker walks on from the last tenant it was given, so successive claims
-- rotate through the tenants (G18), and it keeps what this found for the
-- claims of the next second (agentdb._citus.routed._Ring): on Citus this
-- is the one multi-shard statement of the claim.
-- guarantee: G18
-- zero rows: no tenant has work this worker may take.
-- params: $1 after_tenant uuid, $2 max_tenants int8, $3 task_types text[]
SELECT t.id AS tenant_id
FROM agent_tenants t
WHERE EXISTS (
      SELECT 1 FROM agent_tasks k
      WHERE k.tenant_id = t.id AND k.attempts < k.max_attempts
        AND ((k.state IN ('pending', 'waiting') AND k.wake_at <= now())
             OR (k.state = 'running' AND k.lease_expires_at <= now()))
        AND (k.deadline_at IS NULL OR k.deadline_at > now())
        AND ($3::text[] IS NULL OR k.task_type = ANY ($3)))
ORDER BY t.id <= coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid), t.id
LIMIT $2;

-- name: routed_exhausted_tenants :many
-- Tenants with a task that used up its attempts and is not held by a live
-- lease: where routed_bury has work. A lock-free read.
-- guarantee: G6
-- params: $1 max_tenants int8
SELECT t.id AS tenant_id
FROM agent_tenants t
WHERE EXISTS (
    SELECT 1 FROM agent_tasks k
    WHERE k.tenant_id = t.id AND k.attempts >= k.max_attempts
      AND ((k.state = 'running' AND k.lease_expires_at <= now())
           OR (k.state IN ('pending', 'waiting') AND k.wake_at <= now())))
ORDER BY t.id
LIMIT $1;

-- name: routed_expire_deadlines :many
-- Tenant $1's unfinished tasks whose deadline has passed, moved to 'dead'
-- with their lease dropped (at most $2). The caller writes their events.
-- guarantee: G21
-- zero rows: no deadline of this tenant has passed (or another sweep holds the rows).
-- params: $1 tenant_id uuid, $2 batch int8
WITH victims AS MATERIALIZED (
    SELECT t.id, t.state AS from_state, t.lease_owner AS holder,
           to_char(t.deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS deadline
    FROM agent_tasks t
    WHERE t.tenant_id = $1 AND t.deadline_at <= now() AND t.deadline_at IS NOT NULL
      AND t.state IN ('pending', 'waiting', 'running')
    ORDER BY t.deadline_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_tasks t
SET state = 'dead', state_version = t.state_version + 1, lease_owner = NULL,
    lease_acquired_at = NULL, lease_expires_at = NULL,
    last_error = 'deadline passed at ' || v.deadline, updated_at = now()
FROM victims v
WHERE t.tenant_id = $1 AND t.id = v.id
RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, v.deadline,
          t.trace_id, t.span_id, v.from_state, v.holder;

-- name: routed_operation_by_key :one
-- The operation that holds tenant $1's key $2 (after routed_operation_insert
-- found it taken). The caller compares input_hash (G4).
-- guarantee: G3, G4
-- zero rows: the holder was removed in between (purged); reserve again.
-- params: $1 tenant_id uuid, $2 idempotency_key text
SELECT false AS created, o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action,
       o.input_hash, o.state, o.state_version, o.provider_reference, o.result, o.error,
       o.attempts, o.trace_id, o.span_id, o.created_at, o.updated_at
FROM agent_operations o
WHERE o.tenant_id = $1 AND o.idempotency_key = $2;

-- name: routed_operation_event :execrows
-- One event of one operation of tenant $1 (G8), beside the write that moved it.
-- guarantee: G8
-- zero rows: never; the insert either writes its row or raises.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 operation_id uuid, $4 event_type text, $5 actor_id text, $6 policy_version text, $7 to_state text, $8 operation_state_version int8, $9 payload jsonb, $10 trace_id text, $11 span_id text
INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id, policy_version,
                          to_state, operation_state_version, payload, trace_id, span_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: routed_operation_fence :one
-- Tenant $1's task $2, share-locked for the reservation: its workflow
-- version (the event's policy) and whether the caller's lease ($3, $4; none:
-- NULL) is current (G12).
-- guarantee: G12
-- zero rows: no such task in this tenant.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 lease_owner text, $4 lease_token int8
SELECT t.workflow_version,
       ($3::text IS NULL OR (t.state = 'running' AND t.lease_owner = $3
                             AND t.lease_token = $4)) AS ok
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.id = $2
FOR SHARE;

-- name: routed_operation_insert :one
-- Reserve tenant $1's key $4 for this input hash (G3); nothing if it is taken.
-- The caller has checked the lease (routed_operation_fence) in this transaction.
-- guarantee: G3, G13
-- zero rows: the key is taken; read its holder (routed_operation_by_key).
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_id uuid, $4 idempotency_key text, $5 action text, $6 input_hash text, $7 trace_id text, $8 span_id text
INSERT INTO agent_operations (id, tenant_id, task_id, idempotency_key, action, input_hash,
                              trace_id, span_id)
VALUES ($2, $1, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING true AS created, id, tenant_id, task_id, idempotency_key, action, input_hash, state,
          state_version, provider_reference, result, error, attempts, trace_id, span_id,
          created_at, updated_at;

-- name: routed_operation_settle :one
-- The operation_settle UPDATE alone (operations.sql), with the task's
-- workflow version for the event the caller writes (routed_operation_event).
-- guarantee: G7, G12, G13
-- zero rows: the operation is gone, in another state, at another version, or the caller's lease was taken over; reload before deciding anything.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8, $4 from_states text[], $5 to_state text, $6 provider_reference text, $7 result jsonb, $8 error text, $9 lease_owner text, $10 lease_token int8
UPDATE agent_operations o
SET state = $5,
    state_version = o.state_version + 1,
    provider_reference = coalesce($6, o.provider_reference),
    result = coalesce($7, o.result),
    error = CASE WHEN $5 = 'succeeded' THEN NULL ELSE coalesce($8, o.error) END,
    attempts = CASE WHEN $5 = 'reserved' THEN o.attempts + 1 ELSE o.attempts END,
    updated_at = now()
-- The state and the lease (running: agent_tasks_running_is_leased) said so
-- that only the primary keys can find the rows: "Held snapshots", leases.sql.
WHERE o.tenant_id = $1 AND o.id = $2 AND o.state_version = $3
  AND array_position($4, o.state) IS NOT NULL
  AND ($9::text IS NULL OR EXISTS (
      SELECT 1 FROM agent_tasks t
      WHERE t.tenant_id = $1 AND t.id = o.task_id
        AND t.lease_owner = $9 AND t.lease_token = $10
      FOR SHARE))
RETURNING o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action, o.input_hash,
          o.state, o.state_version, o.provider_reference, o.result, o.error, o.attempts,
          o.trace_id, o.span_id, o.created_at, o.updated_at,
          (SELECT t.workflow_version FROM agent_tasks t
           WHERE t.tenant_id = $1 AND t.id = o.task_id) AS policy_version;

-- name: routed_outbox_claim :many
-- outbox_claim (outbox.sql) for tenant $1 alone: lease up to $3 of its due
-- pending messages to relay $2 for $4. SKIP LOCKED keeps relays disjoint. A
-- due message that used its attempts is buried as 'dead' instead, and
-- returned with buried = true, as outbox_claim does: one UPDATE whose CASEs
-- do both, which Citus routes whole to the tenant's shard (data-modifying
-- CTEs under a UNION ALL it planned recursively: subplans, intermediate
-- results, a final step on the coordinator).
-- guarantee: G10
-- zero rows: nothing of the tenant's is due.
-- params: $1 tenant_id uuid, $2 lease_owner text, $3 batch int8, $4 visibility interval
WITH due AS MATERIALIZED (
    -- The instant here: Citus refuses now() inside a CASE.
    SELECT id, attempts >= max_attempts AS exhausted, now() + $4 AS visible_until
    FROM agent_outbox
    WHERE tenant_id = $1 AND state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_outbox o
SET state = CASE WHEN d.exhausted THEN 'dead' ELSE o.state END,
    last_error = CASE WHEN d.exhausted
                      THEN 'no outcome recorded for attempt ' || o.attempts || ' of '
                           || o.max_attempts || ': its relay stopped or lost the claim mid-publish'
                      ELSE o.last_error END,
    lease_owner = CASE WHEN d.exhausted THEN o.lease_owner ELSE $2 END,
    lease_token = CASE WHEN d.exhausted THEN o.lease_token ELSE o.lease_token + 1 END,
    attempts = CASE WHEN d.exhausted THEN o.attempts ELSE o.attempts + 1 END,
    next_attempt_at = CASE WHEN d.exhausted THEN o.next_attempt_at ELSE d.visible_until END
FROM due d
WHERE o.tenant_id = $1 AND o.id = d.id
RETURNING d.exhausted AS buried, o.id, o.tenant_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.task_id END AS task_id, o.topic,
          CASE WHEN d.exhausted THEN NULL ELSE o.payload END AS payload,
          o.attempts, o.max_attempts,
          CASE WHEN d.exhausted THEN NULL ELSE o.lease_owner END AS lease_owner,
          CASE WHEN d.exhausted THEN NULL ELSE o.lease_token END AS lease_token,
          CASE WHEN d.exhausted THEN NULL ELSE o.trace_id END AS trace_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.span_id END AS span_id,
          CASE WHEN d.exhausted THEN NULL ELSE o.created_at END AS created_at;

-- name: routed_outbox_delivered :many
-- outbox_mark_delivered (outbox.sql) for tenant $1's messages alone, each
-- fenced by its lease token; the rows returned are the ones still held.
-- guarantee: G10, G11
-- params: $1 tenant_id uuid, $2 ids uuid[], $3 lease_tokens int8[]
UPDATE agent_outbox o
SET state = 'delivered', delivered_at = now(), last_error = NULL
FROM unnest($2::uuid[], $3::int8[]) AS m (id, lease_token)
WHERE o.tenant_id = $1 AND o.id = m.id AND o.lease_token = m.lease_token
  AND o.state NOT IN ('delivered', 'dead')  -- pending: see "Held snapshots" in leases.sql
RETURNING o.tenant_id, o.id;

-- name: routed_outbox_due_tenants :many
-- Up to $2 tenants with a pending message due now, in walk order: the
-- tenants after $1 by id, then from the first. Where a relay's per-tenant
-- claim (routed_outbox_claim) has work; a lock-free read of every shard,
-- kept for the claims of the next second as routed_due_tenants is.
-- guarantee: G10
-- zero rows: nothing is due.
-- params: $1 after_tenant uuid, $2 max_tenants int8
SELECT t.id AS tenant_id
FROM agent_tenants t
WHERE EXISTS (SELECT 1 FROM agent_outbox o
              WHERE o.tenant_id = t.id AND o.state = 'pending' AND o.next_attempt_at <= now())
ORDER BY t.id <= coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid), t.id
LIMIT $2;

-- name: routed_outbox_retry :one
-- The outbox_retry UPDATE alone (outbox.sql): tenant $1's dead message $2
-- back to pending, due now, its attempts given back. It returns what the
-- caller needs to write the outbox.retried event on the message's task
-- (routed_task_event) in the same transaction: the attempts it had used
-- and the task's workflow version.
-- guarantee: G10, G8
-- zero rows: no such message in this tenant, or it is not dead (already retried, delivered or pending).
-- params: $1 tenant_id uuid, $2 id uuid
WITH prior AS MATERIALIZED (
    SELECT o.attempts, t.workflow_version
    FROM agent_outbox o
    LEFT JOIN agent_tasks t ON t.tenant_id = o.tenant_id AND t.id = o.task_id
    WHERE o.tenant_id = $1 AND o.id = $2
    FOR UPDATE OF o
)
UPDATE agent_outbox o
SET state = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL
FROM prior
WHERE o.tenant_id = $1 AND o.id = $2 AND o.state = 'dead'
RETURNING o.id, o.tenant_id, o.task_id, o.topic, o.state, o.attempts, o.max_attempts,
          o.next_attempt_at, o.delivered_at, o.last_error, o.trace_id, o.span_id,
          prior.attempts AS prior_attempts, prior.workflow_version AS policy_version;

-- name: routed_release :one
-- The lease_release UPDATE alone (leases.sql). The caller writes the event
-- (routed_task_event). $5 is never NULL here: Citus refuses now() inside
-- COALESCE or CASE, so "now" is asked for as -infinity and taken by greatest().
-- guarantee: G12, G7
-- zero rows: the lease is gone - another worker took the task over, or it left 'running'.
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_owner text, $4 lease_token int8, $5 wake_at timestamptz, $6 refund_attempt bool, $7 last_error text
UPDATE agent_tasks t
SET state = CASE WHEN NOT $6 AND t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
    state_version = t.state_version + 1,
    wake_at = greatest($5, now()),
    attempts = CASE WHEN $6 THEN t.attempts - 1 ELSE t.attempts END,
    last_error = coalesce($7, t.last_error),
    lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE t.tenant_id = $1 AND t.id = $2
  AND t.lease_owner = $3 AND t.lease_token = $4  -- running (see "Held snapshots", leases.sql)
RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.wake_at,
          t.attempts, t.trace_id, t.span_id;

-- name: routed_task_by_key :one
-- Tenant $1's task under dedupe key $2: the answer to a retried create
-- whose insert found the key taken (routed_task_insert returned nothing).
-- guarantee: G4
-- zero rows: the holder of the key is not visible yet (a concurrent create has not committed); run the create again.
-- params: $1 tenant_id uuid, $2 dedupe_key text
SELECT false AS created, id, tenant_id, task_type, workflow_version, state, state_version,
       current_step, wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM agent_tasks
WHERE tenant_id = $1 AND dedupe_key = $2;

-- name: routed_task_event :execrows
-- One event of one task of tenant $1 (G8): the event a claim, a transition
-- or a burial writes beside its UPDATE, in the same transaction. The
-- deferred agent_tasks_event_required check finds it at commit.
-- guarantee: G8
-- zero rows: never; the insert either writes its row or raises.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 event_type text, $4 actor_id text, $5 policy_version text, $6 from_state text, $7 to_state text, $8 task_state_version int8, $9 payload jsonb, $10 trace_id text, $11 span_id text
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, from_state,
                          to_state, task_state_version, payload, trace_id, span_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: routed_task_insert :one
-- The task_create INSERT alone (tasks.sql) for tenant $1: a key already
-- taken inserts nothing. The caller then reads the key's holder
-- (routed_task_by_key), or writes the task.created event
-- (routed_task_event) in the same transaction.
-- guarantee: G3, G4
-- zero rows: dedupe key $7 is taken in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_type text, $4 workflow_version text, $5 state text, $6 params jsonb, $7 dedupe_key text, $8 input_hash text, $9 wake_at timestamptz, $10 max_attempts int4, $11 lease_ttl interval, $12 trace_id text, $13 span_id text, $14 deadline_at timestamptz, $15 parent_id uuid, $16 child_key text
INSERT INTO agent_tasks (id, tenant_id, task_type, workflow_version, state, params,
                         dedupe_key, input_hash, wake_at, max_attempts, lease_ttl,
                         trace_id, span_id, deadline_at, parent_id, child_key)
VALUES ($2, $1, $3, $4, $5, $6, $7, $8,
        coalesce($9, CASE WHEN $5 = 'waiting' THEN 'infinity'::timestamptz ELSE now() END),
        $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (tenant_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING true AS created, id, tenant_id, task_type, workflow_version, state, state_version,
          current_step, wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
          lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
          trace_id, span_id, created_at, updated_at;

-- name: routed_task_retry :one
-- The task_retry UPDATE alone (tasks.sql): tenant $1's failed or dead task
-- $2, still at $3, back to pending. The caller writes its task.retried
-- event (routed_task_event) in the same transaction, with the state it left
-- and the attempts it had used, which this returns.
-- guarantee: G6, G7, G8
-- zero rows: the task is gone, is not failed or dead, or another writer moved state_version on; reload it.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8
WITH prior AS MATERIALIZED (
    SELECT state, attempts FROM agent_tasks WHERE tenant_id = $1 AND id = $2 FOR UPDATE
)
UPDATE agent_tasks t
SET state = 'pending',
    state_version = t.state_version + 1,
    wake_at = now(),
    attempts = 0,
    wait_signal = NULL,
    wait_children = NULL,
    updated_at = now()
FROM prior
WHERE t.tenant_id = $1 AND t.id = $2 AND t.state IN ('failed', 'dead')
  AND t.state_version = $3
RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
          t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
          t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
          t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id,
          t.created_at, t.updated_at, prior.state AS from_state,
          prior.attempts AS prior_attempts;

-- name: routed_tenant_by_id :one
-- Tenant $1 (agent_tenants is distributed by id: one shard), answered as
-- tenant_create answers for a name that is taken (created = false).
-- guarantee: G2
-- zero rows: no tenant has that id (its name's tenant was deleted).
-- params: $1 id uuid
SELECT false AS created, id, name, state, created_at
FROM agent_tenants
WHERE id = $1;

-- name: routed_tenant_insert :one
-- The tenant_create INSERT alone (tenancy.sql), once its name is claimed in
-- agent_tenant_names in the same transaction (routed_tenant_name_claim).
-- guarantee: G2
-- zero rows: never (an INSERT without ON CONFLICT returns its row or raises).
-- params: $1 id uuid, $2 name text
INSERT INTO agent_tenants (id, name)
VALUES ($1, $2)
RETURNING true AS created, id, name, state, created_at;

-- name: routed_tenant_name_claim :one
-- Claim name $2 for tenant $1 (G2): on Citus the names are unique in
-- agent_tenant_names, a reference table (0013.operator), not on
-- agent_tenants. A name another create holds, committed or not, is not
-- taken (ON CONFLICT waits for the other to end).
-- guarantee: G2
-- zero rows: the name is taken; read its holder (routed_tenant_name_holder).
-- params: $1 id uuid, $2 name text
INSERT INTO agent_tenant_names (name, tenant_id)
VALUES ($2, $1)
ON CONFLICT (name) DO NOTHING
RETURNING tenant_id;

-- name: routed_tenant_name_holder :one
-- The tenant that holds name $1 (G2), locked until this transaction ends so
-- a holder found deleted is taken over once (routed_tenant_name_take).
-- guarantee: G2
-- zero rows: nobody holds the name (a take-over in between rolled back); claim it again.
-- params: $1 name text
SELECT tenant_id
FROM agent_tenant_names
WHERE name = $1
FOR UPDATE;

-- name: routed_tenant_name_take :one
-- Give name $1, whose tenant $3 was deleted, to tenant $2 (G2).
-- guarantee: G2
-- zero rows: the name is no longer $3's; read its holder again.
-- params: $1 name text, $2 id uuid, $3 deleted_id uuid
UPDATE agent_tenant_names
SET tenant_id = $2
WHERE name = $1 AND tenant_id = $3
RETURNING tenant_id;

-- name: routed_transition :one
-- task_transition (tasks.sql) on Citus: move tenant $1's task $2 if it is
-- still at $3 and, for a lease holder, under the caller's lease, with its
-- event and outbox messages. One call of agentdb_routed_transition()
-- (0021.delegated_writes), whose UPDATE this statement's was: Citus sends it
-- whole to the tenant's node when it is made outside a transaction block.
-- guarantee: G7, G12, G22, G23, G8, G10
-- zero rows: the task is gone, another writer moved state_version on, or the caller's lease was taken over; reload before deciding anything.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8, $4 to_state text, $5 set_step bool, $6 current_step text, $7 wake_at timestamptz, $8 last_error text, $9 lease_owner text, $10 lease_token int8, $11 event_type text, $12 actor_id text, $13 payload jsonb, $14 outbox_ids uuid[], $15 outbox_topics text[], $16 outbox_payloads jsonb[], $17 trace_id text, $18 span_id text, $19 wait_signal text, $20 signal_cursor int8, $21 wait_children int4
SELECT c.id, c.tenant_id, c.task_type, c.workflow_version, c.state, c.state_version,
       c.current_step, c.wake_at, c.dedupe_key, c.input_hash, c.params, c.attempts,
       c.max_attempts, c.last_error, c.lease_ttl, c.lease_owner, c.lease_token,
       c.lease_acquired_at, c.lease_expires_at, c.deadline_at, c.trace_id, c.span_id,
       c.created_at, c.updated_at
FROM agentdb_routed_transition($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                               $16, $17, $18, $19, $20, $21) c;
