-- Leases on tasks (G12). Every statement a holder runs names its lease
-- (owner + token); a holder whose lease was taken over matches nothing.

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

-- name: lease_check :one
-- Read the lease fields of a task, to explain a zero-row write.
-- guarantee: G12
-- zero rows: no such task in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT state, state_version, lease_owner, lease_token, lease_expires_at
FROM agent_tasks
WHERE tenant_id = $1 AND id = $2;
