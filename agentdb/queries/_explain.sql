-- Read only on the failure path: why a guarded write matched no row, so the
-- caller gets NotFound, StaleVersion or LeaseLost instead of a bare zero.

-- name: explain_operation :one
-- The state and version of an operation, to explain a zero-row settle.
-- guarantee: G7
-- zero rows: no such operation in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT state, state_version
FROM agent_operations
WHERE tenant_id = $1 AND id = $2;

-- name: explain_outbox :one
-- The relay lease of an outbox message, to explain a zero-row mark.
-- guarantee: G10
-- zero rows: no such message in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT state, lease_owner, lease_token
FROM agent_outbox
WHERE tenant_id = $1 AND id = $2;

-- name: explain_task :one
-- The state, version and lease of a task, and whether its deadline passed,
-- to explain a zero-row write.
-- guarantee: G7, G12, G21
-- zero rows: no such task in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT t.state, t.state_version, t.lease_owner, t.lease_token, t.lease_expires_at,
       coalesce(t.deadline_at <= now(), false) AS late,
       t.state = 'dead' AND EXISTS (
           SELECT 1 FROM agent_events e
           WHERE e.tenant_id = $1 AND e.task_id = $2 AND e.event_type = 'task.deadline_passed'
       ) AS swept
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.id = $2;
