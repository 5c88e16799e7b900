-- What an operator looks at, one tenant at a time: tasks by state, a task's
-- timeline, the approvals waiting for a human, the effects to reconcile, the
-- dead messages, the last hour's activity. Read-only; every statement names
-- its tenant (G2), and run as agentdb_operator it sees no other (G15).

-- name: overview_activity :many
-- Tenant $1's activity per minute over the last $2 minutes (oldest first):
-- tasks created and tasks that finished (their finishing events).
-- guarantee: G2, G15
-- zero rows: never ($2 >= 1: one row per minute, zero counts included).
-- params: $1 tenant_id uuid, $2 minutes int4
SELECT m.minute,
       count(e.id) FILTER (WHERE e.event_type = 'task.created') AS created,
       count(e.id) FILTER (WHERE e.to_state IN ('succeeded', 'failed', 'cancelled', 'dead')
                             AND e.from_state IS DISTINCT FROM e.to_state) AS finished
FROM generate_series(date_trunc('minute', now()) - ($2 - 1) * interval '1 minute',
                     date_trunc('minute', now()), interval '1 minute') AS m (minute)
LEFT JOIN agent_events e
       ON e.tenant_id = $1 AND e.created_at >= m.minute
      AND e.created_at < m.minute + interval '1 minute'
GROUP BY m.minute
ORDER BY m.minute;

-- name: overview_approvals :many
-- Tenant $1's tasks asleep on a signal, oldest first: what each waits for
-- (the signal's name, the waiting step), what it asks (the step the agent
-- framework adapters record beside the wait, "<step>/asked", with the tool
-- and its arguments), the last step it recorded before it, and who held its
-- lease (G22: none of them may approve it).
-- guarantee: G2, G15, G22
-- zero rows: no task of the tenant waits for a signal.
-- params: $1 tenant_id uuid, $2 limit int8
SELECT t.id, t.task_type, t.params, t.wait_signal, t.updated_at, t.created_at,
       extract(epoch FROM now() - t.updated_at)::float8 AS waiting_s,
       w.name AS step, a.result AS asked, d.name AS last_step, d.result AS last_result,
       array(SELECT DISTINCT e.actor_id FROM agent_events e
             WHERE e.tenant_id = $1 AND e.task_id = t.id AND e.to_state = 'running'
             ORDER BY 1) AS lease_holders
FROM agent_tasks t
LEFT JOIN LATERAL (
    SELECT s.name FROM agent_steps s
    WHERE s.tenant_id = $1 AND s.task_id = t.id AND s.kind = 'signal' AND s.state = 'waiting'
    ORDER BY s.created_at DESC LIMIT 1
) w ON true
LEFT JOIN agent_steps a ON a.tenant_id = $1 AND a.task_id = t.id AND a.name = w.name || '/asked'
LEFT JOIN LATERAL (
    SELECT s.name, s.result FROM agent_steps s
    WHERE s.tenant_id = $1 AND s.task_id = t.id AND s.kind = 'step' AND s.state = 'done'
      AND s.name NOT LIKE '%/asked'
    ORDER BY s.created_at DESC LIMIT 1
) d ON true
WHERE t.tenant_id = $1 AND t.state = 'waiting' AND t.wait_signal IS NOT NULL
ORDER BY t.updated_at
LIMIT $2;

-- name: overview_outbox :many
-- Tenant $1's messages in state $2 (e.g. 'dead'), newest first.
-- guarantee: G2, G15, G10
-- zero rows: the tenant has no message in that state.
-- params: $1 tenant_id uuid, $2 state text, $3 limit int8
SELECT id, task_id, topic, payload, state, attempts, max_attempts, next_attempt_at,
       delivered_at, last_error, created_at
FROM agent_outbox
WHERE tenant_id = $1 AND state = $2
ORDER BY created_at DESC
LIMIT $3;

-- name: overview_task_events :many
-- Task $2's audit trail in order.
-- guarantee: G2, G15, G8
-- zero rows: no such task in this tenant (every task has its creation event).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT id, event_type, actor_id, from_state, to_state, operation_id, payload, created_at
FROM agent_events
WHERE tenant_id = $1 AND task_id = $2
ORDER BY id;

-- name: overview_task_list :many
-- Tenant $1's tasks, in state $2 (NULL: any), most recently changed first.
-- guarantee: G2, G15
-- zero rows: the tenant has no task (in that state).
-- params: $1 tenant_id uuid, $2 state text, $3 limit int8
SELECT id, task_type, state, attempts, max_attempts, last_error, wait_signal, parent_id,
       lease_owner, created_at, updated_at,
       extract(epoch FROM now() - created_at)::float8 AS age_s
FROM agent_tasks
WHERE tenant_id = $1 AND ($2::text IS NULL OR state = $2)
ORDER BY updated_at DESC, id
LIMIT $3;

-- name: overview_task_operations :many
-- Task $2's effects (operations) with their outcome, in the order reserved.
-- guarantee: G2, G15, G13
-- zero rows: the task reserved no operation (or is not in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT id, idempotency_key, action, state, provider_reference, result, error, attempts,
       created_at, updated_at
FROM agent_operations
WHERE tenant_id = $1 AND task_id = $2
ORDER BY created_at, id;

-- name: overview_task_outbox :many
-- The messages task $2 sent (its outbox rows) with their delivery state.
-- guarantee: G2, G15, G10
-- zero rows: the task sent no message (or is not in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT id, topic, state, attempts, max_attempts, delivered_at, last_error, created_at
FROM agent_outbox
WHERE tenant_id = $1 AND task_id = $2
ORDER BY created_at, id;

-- name: overview_task_signals :many
-- Task $2's signals and approvals in their order.
-- guarantee: G2, G15, G22
-- zero rows: the task got no signal (or is not in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT seq, name, kind, decision, sender, payload, created_at
FROM agent_signals
WHERE tenant_id = $1 AND task_id = $2
ORDER BY seq;

-- name: overview_task_states :many
-- Tenant $1's tasks by state: how many, and how long the oldest has been in it.
-- guarantee: G2, G15
-- zero rows: the tenant has no task.
-- params: $1 tenant_id uuid
SELECT state, count(*) AS n, extract(epoch FROM now() - min(updated_at))::float8 AS oldest_s
FROM agent_tasks
WHERE tenant_id = $1
GROUP BY state
ORDER BY state;

-- name: overview_task_steps :many
-- Task $2's recorded steps (G25) in the order recorded.
-- guarantee: G2, G15, G25
-- zero rows: the task recorded no step (or is not in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT name, kind, state, result, wake_at, signal_seq, created_at, updated_at
FROM agent_steps
WHERE tenant_id = $1 AND task_id = $2
ORDER BY created_at, name;

-- name: overview_unsettled :many
-- Tenant $1's operations left reserved, in flight or unknown whose task holds
-- no live lease: the effects to reconcile from the provider's records (G13).
-- guarantee: G2, G15, G13
-- zero rows: nothing of the tenant's needs reconciling.
-- params: $1 tenant_id uuid, $2 limit int8
SELECT o.id, o.task_id, o.idempotency_key, o.action, o.state, o.provider_reference, o.error,
       o.attempts, o.created_at, o.updated_at,
       extract(epoch FROM now() - o.updated_at)::float8 AS age_s
FROM agent_operations o
JOIN agent_tasks t ON t.tenant_id = o.tenant_id AND t.id = o.task_id
WHERE o.tenant_id = $1 AND o.state IN ('reserved', 'in_flight', 'unknown')
  AND NOT (t.state = 'running' AND t.lease_expires_at > now())
ORDER BY o.updated_at
LIMIT $2;
