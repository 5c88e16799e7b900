-- Child tasks (G23): a parent's children, their results, and how many there are.

-- name: child_count :one
-- How many children task $2 has: what "wait for all of them" waits for.
-- guarantee: G23
-- zero rows: never; a count comes back (0 for a task without children).
-- params: $1 tenant_id uuid, $2 parent_id uuid
SELECT count(*) AS n FROM agent_tasks WHERE tenant_id = $1 AND parent_id = $2;

-- name: child_list :many
-- Task $2's children in creation order, each with its key and, once it has
-- finished, its result: the payload of its finishing event (redacted, up to
-- 8 KiB, NULL once the event payload's retention has passed).
-- guarantee: G23, G2
-- zero rows: the task has no children (or is not in this tenant).
-- params: $1 tenant_id uuid, $2 parent_id uuid
SELECT c.id, c.tenant_id, c.task_type, c.workflow_version, c.state, c.state_version,
       c.current_step, c.wake_at, c.dedupe_key, c.input_hash, c.params, c.attempts,
       c.max_attempts, c.last_error, c.lease_ttl, c.lease_owner, c.lease_token,
       c.lease_acquired_at, c.lease_expires_at, c.deadline_at, c.trace_id, c.span_id,
       c.created_at, c.updated_at, c.child_key, e.payload AS result
FROM agent_tasks c
LEFT JOIN agent_events e
       ON e.tenant_id = c.tenant_id AND e.task_id = c.id AND e.task_state_version = c.state_version
      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead')
WHERE c.tenant_id = $1 AND c.parent_id = $2
ORDER BY c.created_at, c.id;
