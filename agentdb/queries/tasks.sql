-- Tasks: the user-level workflow (G1). Every state write is versioned (G7),
-- fenced by the lease when a holder makes it (G12), and writes its event in
-- the same statement (G8).

-- name: task_count_unhandled :many
-- Due tasks of types outside $1: a worker with only these handlers never
-- claims them, so it says so instead of letting them wait in silence.
-- guarantee: none
-- params: $1 task_types text[]
SELECT task_type, count(*) AS n
FROM agent_tasks
WHERE state IN ('pending', 'waiting') AND wake_at <= now() AND task_type <> ALL ($1)
GROUP BY task_type
ORDER BY task_type;

-- name: task_create :one
-- Insert a task and its creation event. A retried request with the same
-- dedupe key inserts nothing and returns the existing task (created = false);
-- the caller compares input_hash and refuses a different request (G4).
-- With $18 true the statement is its own transaction and its caller wakes the
-- listeners after the commit (agentdb/_db/wake.py): agentdb.wake keeps the
-- NOTIFY trigger quiet inside it, so concurrent creates group-commit instead
-- of committing one at a time behind the cluster-wide notify lock
-- (0017.wake_after_commit).
-- guarantee: G3, G4
-- zero rows: a concurrent request committed the same dedupe key after this statement's snapshot was taken; run it again.
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_type text, $4 workflow_version text, $5 state text, $6 params jsonb, $7 dedupe_key text, $8 input_hash text, $9 wake_at timestamptz, $10 max_attempts int4, $11 lease_ttl interval, $12 trace_id text, $13 span_id text, $14 deadline_at timestamptz, $15 parent_id uuid, $16 child_key text, $17 actor_id text, $18 wake_after bool
WITH wake AS MATERIALIZED (
    SELECT CASE WHEN $18 THEN set_config('agentdb.wake', 'after_commit', true) END AS quiet
), ins AS (
    INSERT INTO agent_tasks (id, tenant_id, task_type, workflow_version, state, params,
                             dedupe_key, input_hash, wake_at, max_attempts, lease_ttl,
                             trace_id, span_id, deadline_at, parent_id, child_key)
    SELECT $2, $1, $3, $4, $5, $6, $7, $8,
           coalesce($9, CASE WHEN $5 = 'waiting' THEN 'infinity'::timestamptz ELSE now() END),
           $10, $11, $12, $13, $14, $15, $16
    FROM wake
    ON CONFLICT (tenant_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
    RETURNING id, tenant_id, task_type, workflow_version, state, state_version, current_step,
              wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
              lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
              trace_id, span_id, created_at, updated_at
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              to_state, task_state_version, trace_id, span_id)
    SELECT tenant_id, id, 'task.created', $17, workflow_version, state, state_version,
           trace_id, span_id
    FROM ins
)
SELECT true AS created, id, tenant_id, task_type, workflow_version, state, state_version,
       current_step, wake_at, dedupe_key, input_hash, params, attempts, max_attempts,
       last_error, lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM ins
UNION ALL
SELECT false, t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
       t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
       t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
       t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id, t.created_at,
       t.updated_at
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.dedupe_key = $7 AND NOT EXISTS (SELECT 1 FROM ins);

-- name: task_finish_many :many
-- Finish many claimed tasks in one statement (one commit): each element
-- moves running -> $6 (succeeded, failed, cancelled or dead) only if it is
-- still at its expected state_version and still under the caller's lease
-- (owner + token), drops the lease, and writes its event and its outbox
-- messages ($11 names the 1-based input element each message belongs to).
-- An element's event payload is its own ($15, padded with NULL when shorter)
-- or else the batch's ($10).
-- Returns one row per element that was finished, tagged with its 1-based
-- position in the input (ord); an element with no row was refused and
-- nothing was written for it - not the state, not the event, not its
-- messages. The caller reads such rows again to say why. An element past
-- its deadline is one of those (G21).
-- guarantee: G7, G12, G8, G10, G21
-- params: $1 tenant_ids uuid[], $2 ids uuid[], $3 expected_versions int8[], $4 lease_owners text[], $5 lease_tokens int8[], $6 to_state text, $7 last_error text, $8 event_type text, $9 actor_id text, $10 payload jsonb, $11 outbox_ords int8[], $12 outbox_ids uuid[], $13 outbox_topics text[], $14 outbox_payloads jsonb[], $15 payloads jsonb[]
WITH input AS (
    SELECT i.ord, i.tenant_id, i.id, i.expected_version, i.lease_owner, i.lease_token, i.payload
    FROM unnest($1::uuid[], $2::uuid[], $3::int8[], $4::text[], $5::int8[], $15::jsonb[])
         WITH ORDINALITY AS i (tenant_id, id, expected_version, lease_owner, lease_token,
                               payload, ord)
), upd AS (
    UPDATE agent_tasks t
    SET state = $6,
        state_version = t.state_version + 1,
        last_error = coalesce($7, t.last_error),
        lease_owner = NULL,
        lease_acquired_at = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM input i
    WHERE t.tenant_id = i.tenant_id AND t.id = i.id AND t.state_version = i.expected_version
      -- running: see "Held snapshots" in leases.sql
      AND t.lease_owner = i.lease_owner AND t.lease_token = i.lease_token
      -- G21: a late element is refused alone (its guard would refuse the batch),
      -- unless the batch ends it the way the guard allows.
      AND ($6 IN ('dead', 'cancelled') OR t.deadline_at IS NULL OR t.deadline_at > now())
    RETURNING i.ord, i.lease_owner AS released_by, i.payload AS event_payload, t.id, t.tenant_id, t.task_type,
              t.workflow_version, t.state, t.state_version, t.current_step, t.wake_at,
              t.dedupe_key, t.input_hash, t.params, t.attempts, t.max_attempts, t.last_error,
              t.lease_ttl, t.lease_owner, t.lease_token, t.lease_acquired_at,
              t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id, t.created_at, t.updated_at
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, $8, coalesce($9, released_by), workflow_version, 'running', state,
           state_version, coalesce(event_payload, $10, '{}'::jsonb), trace_id, span_id
    FROM upd
), ob AS (
    INSERT INTO agent_outbox (id, tenant_id, task_id, topic, payload, trace_id, span_id)
    SELECT m.id, u.tenant_id, u.id, m.topic, m.payload, u.trace_id, u.span_id
    FROM unnest($11::int8[], $12::uuid[], $13::text[], $14::jsonb[]) AS m (ord, id, topic, payload)
    JOIN upd u ON u.ord = m.ord
)
SELECT ord, id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM upd
ORDER BY ord;

-- name: task_get :one
-- Read one task of one tenant.
-- guarantee: G2
-- zero rows: no such task in this tenant (it may exist in another; that is not visible here).
-- params: $1 tenant_id uuid, $2 id uuid
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM agent_tasks
WHERE tenant_id = $1 AND id = $2;

-- name: task_now :one
-- The database's clock (whose a deadline is, G21).
-- guarantee: G21
-- zero rows: never (a SELECT without FROM returns one row).
-- params: none
SELECT now() AS now;

-- name: task_retry :one
-- An operator's retry: a failed or dead task back to pending, due now, with
-- its attempts given back (a task that died of them would be buried again
-- at once), in one versioned write with its event (task.retried: the actor,
-- the state it left, the attempts it had used, the reason; its last_error
-- stays on the row until the next finish, and is not copied into the event,
-- whose payload G9 checks for secrets). agent_transitions has the
-- two edges (0013.operator); the deadline guard still refuses a task past
-- its deadline (G21), and cancelled or succeeded have no way back.
-- guarantee: G6, G7, G8
-- zero rows: the task is gone, is not failed or dead, or another writer moved state_version on; reload it.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8, $4 actor_id text, $5 payload jsonb
WITH prior AS (
    SELECT state, attempts FROM agent_tasks WHERE tenant_id = $1 AND id = $2
), upd AS (
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
              prior.attempts AS prior_attempts
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, 'task.retried', $4, workflow_version, from_state, state, state_version,
           $5 || jsonb_build_object('attempts', prior_attempts),
           trace_id, span_id
    FROM upd
)
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM upd;

-- name: task_transition :one
-- Move a task to a new state (or record a step without a state change) if
-- it is still at the expected state_version and, for a lease holder, still
-- under the caller's lease; write the event and any outbox messages in the
-- same statement. Leaving 'running' drops the lease; moving to pending or
-- waiting sets wake_at (now / infinity unless given); a wait may name the
-- signal it waits for ($19; any other move clears it) and move the task's
-- signal cursor past what it read ($20; the database refuses a cursor that
-- goes back or past the last signal, G22), or wait for $21 of its children
-- to finish (G23: the last of them wakes it).
-- guarantee: G7, G12, G8, G10, G22, G23
-- zero rows: the task is gone, another writer moved state_version on, or the caller's lease was taken over; reload before deciding anything.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8, $4 to_state text, $5 set_step bool, $6 current_step text, $7 wake_at timestamptz, $8 last_error text, $9 lease_owner text, $10 lease_token int8, $11 event_type text, $12 actor_id text, $13 payload jsonb, $14 outbox_ids uuid[], $15 outbox_topics text[], $16 outbox_payloads jsonb[], $17 trace_id text, $18 span_id text, $19 wait_signal text, $20 signal_cursor int8, $21 wait_children int4
WITH prior AS (
    SELECT state FROM agent_tasks WHERE tenant_id = $1 AND id = $2
), upd AS (
    UPDATE agent_tasks t
    SET state = $4,
        state_version = t.state_version + 1,
        current_step = CASE WHEN $5 THEN $6 ELSE t.current_step END,
        wake_at = CASE
            WHEN $4 IN ('pending', 'waiting')
                THEN coalesce($7, CASE WHEN $4 = 'waiting' THEN 'infinity'::timestamptz ELSE now() END)
            ELSE t.wake_at END,
        last_error = coalesce($8, t.last_error),
        lease_owner = CASE WHEN $4 = 'running' THEN t.lease_owner END,
        lease_acquired_at = CASE WHEN $4 = 'running' THEN t.lease_acquired_at END,
        lease_expires_at = CASE WHEN $4 = 'running' THEN t.lease_expires_at END,
        wait_signal = CASE WHEN $4 = 'waiting' THEN $19 END,
        signal_cursor = coalesce($20, t.signal_cursor),
        wait_children = CASE WHEN $4 = 'waiting' THEN $21::int4 END,
        -- A run that ends waiting gives its attempt back: attempts count the runs that
        -- failed or crashed, so a handler that waits often is not worn out by it.
        attempts = CASE WHEN $4 = 'waiting' AND prior.state = 'running'
                        THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
        updated_at = now()
    FROM prior
    WHERE t.tenant_id = $1 AND t.id = $2 AND t.state_version = $3
      AND ($9::text IS NULL OR (t.lease_owner = $9 AND t.lease_token = $10))
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id, t.created_at,
              t.updated_at, prior.state AS from_state
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, $11, $12, workflow_version, from_state, state, state_version,
           $13, coalesce($17, trace_id), coalesce($18, span_id)
    FROM upd
), ob AS (
    INSERT INTO agent_outbox (id, tenant_id, task_id, topic, payload, trace_id, span_id)
    SELECT m.id, u.tenant_id, u.id, m.topic, m.payload, coalesce($17, u.trace_id),
           coalesce($18, u.span_id)
    FROM upd u, unnest($14::uuid[], $15::text[], $16::jsonb[]) AS m (id, topic, payload)
)
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM upd;

-- name: task_wake_listeners :one
-- Wake the LISTENers of channel $1 after a create committed without a NOTIFY
-- of its own (task_create with $18; agentdb/_db/wake.py). Its own transaction.
-- guarantee: none
-- zero rows: never (a SELECT without FROM returns its one row).
-- params: $1 channel text, $2 payload text
SELECT pg_notify($1, $2);
