-- Leases on tasks (G12). Every statement a holder runs names its lease
-- (owner + token); a holder whose lease was taken over matches nothing.

-- name: lease_bury_exhausted :many
-- Move tasks that used up their attempts and are not held by a live lease to
-- 'dead', with their event. Running tasks qualify only once their lease
-- expired, so a worker still inside its last attempt is never buried.
-- guarantee: G6, G8
-- params: $1 actor_id text, $2 batch int8
WITH victims AS (
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE attempts >= max_attempts
      AND ((state = 'running' AND lease_expires_at <= now())
           OR (state IN ('pending', 'waiting') AND wake_at <= now()))
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), buried AS (
    UPDATE agent_tasks t
    SET state = 'dead', state_version = t.state_version + 1, lease_owner = NULL,
        lease_acquired_at = NULL, lease_expires_at = NULL, updated_at = now()
    FROM victims v
    WHERE t.tenant_id = v.tenant_id AND t.id = v.id
    RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.attempts,
              t.trace_id, t.span_id, v.from_state
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, 'task.dead', $1, workflow_version, from_state, state,
           state_version, jsonb_build_object('attempts', attempts), trace_id, span_id
    FROM buried
)
SELECT tenant_id, id FROM buried;

-- name: lease_claim :many
-- Lease up to $2 due tasks to worker $1: pending/waiting tasks whose wake_at
-- has passed, and running tasks whose lease expired (recovery). Each claim
-- takes a new lease token, counts an attempt and writes its event. SKIP
-- LOCKED lets concurrent workers claim disjoint rows. Tasks that used up
-- their attempts are left to lease_bury_exhausted. On Citus replace this
-- statement by a per-tenant claim (row locks need a single-shard filter).
-- guarantee: G12, G7, G8
-- params: $1 lease_owner text, $2 batch int8, $3 lease_ttl interval, $4 task_types text[]
WITH due AS (
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE state IN ('pending', 'waiting') AND wake_at <= now() AND attempts < max_attempts
      AND ($4::text[] IS NULL OR task_type = ANY ($4))
    ORDER BY wake_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE state = 'running' AND lease_expires_at <= now() AND attempts < max_attempts
      AND ($4::text[] IS NULL OR task_type = ANY ($4))
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT tenant_id, id, from_state FROM expired
    UNION ALL
    SELECT tenant_id, id, from_state FROM due
    LIMIT $2
), claimed AS (
    UPDATE agent_tasks t
    SET state = 'running',
        state_version = t.state_version + 1,
        lease_owner = $1,
        lease_token = t.lease_token + 1,
        lease_acquired_at = now(),
        lease_expires_at = now() + coalesce($3, t.lease_ttl),
        attempts = t.attempts + 1,
        updated_at = now()
    FROM picked p
    WHERE t.tenant_id = p.tenant_id AND t.id = p.id
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.trace_id, t.span_id, t.created_at,
              t.updated_at, p.from_state
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id,
           CASE WHEN from_state = 'running' THEN 'task.reclaimed' ELSE 'task.claimed' END,
           lease_owner, workflow_version, from_state, state, state_version,
           jsonb_build_object('lease_token', lease_token, 'attempt', attempts),
           trace_id, span_id
    FROM claimed
)
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at,
       trace_id, span_id, created_at, updated_at
FROM claimed;

-- name: lease_release :one
-- Give the task back: running -> pending (due at $5, default now), or
-- 'dead' if it has used its attempts and $6 is false. With $6 (a graceful
-- shutdown) the attempt is refunded so the next worker's claim does not
-- count it twice. Writes the event.
-- guarantee: G12, G7, G8
-- zero rows: the lease is gone - another worker took the task over, or it left 'running'.
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_owner text, $4 lease_token int8, $5 wake_at timestamptz, $6 refund_attempt bool, $7 last_error text, $8 event_type text
WITH upd AS (
    UPDATE agent_tasks t
    SET state = CASE WHEN NOT $6 AND t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
        state_version = t.state_version + 1,
        wake_at = coalesce($5, now()),
        attempts = CASE WHEN $6 THEN t.attempts - 1 ELSE t.attempts END,
        last_error = coalesce($7, t.last_error),
        lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE t.tenant_id = $1 AND t.id = $2 AND t.state = 'running'
      AND t.lease_owner = $3 AND t.lease_token = $4
    RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.wake_at,
              t.attempts, t.trace_id, t.span_id
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, $8, $3, workflow_version, 'running', state, state_version,
           jsonb_build_object('lease_token', $4::int8, 'attempts', attempts), trace_id, span_id
    FROM upd
)
SELECT state, state_version, wake_at, attempts FROM upd;

-- name: lease_renew :one
-- Extend the caller's lease. Changes only lease_expires_at (and updated_at),
-- so it does not bump state_version (the one exception the version guard
-- allows). An expired lease that nobody took over can still be renewed: the
-- token, not the clock, is the fence.
-- guarantee: G12
-- zero rows: the lease is gone - another worker took the task over, or it left 'running'; stop working on it.
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_owner text, $4 lease_token int8, $5 lease_ttl interval
UPDATE agent_tasks
SET lease_expires_at = now() + coalesce($5, lease_ttl), updated_at = now()
WHERE tenant_id = $1 AND id = $2 AND state = 'running'
  AND lease_owner = $3 AND lease_token = $4
RETURNING lease_expires_at;
