-- Signals and approvals (G22): facts sent to a task, each given its place in
-- the task's order by the database (agent_signals_guard), recorded in the
-- audit trail and waking a task that waits for them (agent_signals_deliver).

-- name: signal_by_key :one
-- The signal a dedupe key recorded for a task: the answer to a retried send.
-- guarantee: G3, G4
-- zero rows: the key has recorded nothing for this task (yet).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 dedupe_key text
SELECT id, tenant_id, task_id, seq, name, kind, decision, payload, sender, dedupe_key,
       input_hash, created_at
FROM agent_signals
WHERE tenant_id = $1 AND task_id = $2 AND dedupe_key = $3;

-- name: signal_insert :one
-- Record a signal; its triggers lock the task, refuse a finished or late one
-- (or an approval by its lease holder), give it its seq, write its event and
-- wake the task if it waits for this name - all in this statement.
-- guarantee: G22, G3, G2
-- zero rows: a concurrent send of the same dedupe key committed first; read it by key.
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_id uuid, $4 name text, $5 kind text, $6 decision text, $7 payload jsonb, $8 sender text, $9 dedupe_key text, $10 input_hash text
INSERT INTO agent_signals (tenant_id, id, task_id, name, kind, decision, payload, sender,
                           dedupe_key, input_hash)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id, task_id, dedupe_key) DO NOTHING
RETURNING id, tenant_id, task_id, seq, name, kind, decision, payload, sender, dedupe_key,
          input_hash, created_at;

-- name: signal_list :many
-- A task's signals after seq $3, in order (its whole history from 0).
-- guarantee: G22
-- zero rows: no signal after $3 (or no such task in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 after int8
SELECT id, tenant_id, task_id, seq, name, kind, decision, payload, sender, dedupe_key,
       input_hash, created_at
FROM agent_signals
WHERE tenant_id = $1 AND task_id = $2 AND seq > $3
ORDER BY seq;

-- name: signal_unread :many
-- A task's signals it has not read yet (after its signal_cursor), in order.
-- guarantee: G22
-- zero rows: nothing unread (or no such task in this tenant).
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT s.id, s.tenant_id, s.task_id, s.seq, s.name, s.kind, s.decision, s.payload, s.sender,
       s.dedupe_key, s.input_hash, s.created_at
FROM agent_signals s
JOIN agent_tasks t ON t.tenant_id = s.tenant_id AND t.id = s.task_id
WHERE s.tenant_id = $1 AND s.task_id = $2 AND t.tenant_id = $1 AND s.seq > t.signal_cursor
ORDER BY s.seq;
