-- Steps (G25): what a durable handler recorded, read back in one round trip
-- when it is re-entered, and each new record written once, under the lease.
-- Every write presents the lease it runs under ($lease_owner, $lease_token):
-- the statement writes nothing unless it is the task's current one, and the
-- trigger agent_steps_guard refuses any writer whose token is not (AG018).

-- name: step_finish :one
-- Finish waiting step $3 of task $2, once: its result (a fan-out's
-- children, a sleep's end, a wait that timed out).
-- guarantee: G25, G12
-- zero rows: the lease is not the task's current one, or the step is not waiting (finished already: read it by name).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 name text, $4 result jsonb, $5 lease_owner text, $6 lease_token int8
UPDATE agent_steps s
SET state = 'done', result = $4, lease_token = $6, updated_at = now()
FROM agent_tasks t
WHERE s.tenant_id = $1 AND s.task_id = $2 AND s.name = $3 AND s.state = 'waiting'
  AND t.tenant_id = $1 AND t.id = $2
  AND t.lease_owner = $5 AND t.lease_token = $6  -- running: see "Held snapshots" in leases.sql
-- A finished step is not waiting for its wake_at any more: "due" means nothing for it.
RETURNING s.name, s.kind, s.state, s.input_hash, s.result, s.wake_at;

-- name: step_get :one
-- One recorded step of task $2 (a wait's taken signal joined in): what a
-- write that found its name taken, or took nothing, reads.
-- guarantee: G25
-- zero rows: step $3 is not recorded.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 name text
SELECT s.name, s.kind, s.state, s.input_hash, s.result, s.wake_at, s.wake_at <= now() AS due,
       s.signal_seq, g.id AS signal_id, g.name AS signal_name, g.kind AS signal_kind, g.decision,
       g.payload AS signal_payload, g.sender, g.dedupe_key AS signal_dedupe_key,
       g.input_hash AS signal_input_hash, g.created_at AS signal_created_at
FROM agent_steps s
LEFT JOIN agent_signals g
       ON g.tenant_id = s.tenant_id AND g.task_id = s.task_id AND g.seq = s.signal_seq
      AND g.tenant_id = $1
WHERE s.tenant_id = $1 AND s.task_id = $2 AND s.name = $3;

-- name: step_insert :one
-- Record step $3 of task $2: done with its result, or waiting (a wait, a
-- sleep, a fan-out) until wake_at. Written only while the lease is current.
-- guarantee: G25, G12, G4
-- zero rows: the lease ($10, $11) is not the task's current one, or step $3 is recorded already (an earlier write whose answer was lost); read it by name.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 name text, $4 kind text, $5 state text, $6 input_hash text, $7 result jsonb, $8 signal_seq int8, $9 wait interval, $10 lease_owner text, $11 lease_token int8
INSERT INTO agent_steps (tenant_id, task_id, name, kind, state, input_hash, result, signal_seq,
                         wake_at, lease_token)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, now() + $9::interval, $11
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.id = $2
  AND t.lease_owner = $10 AND t.lease_token = $11  -- running: see "Held snapshots" in leases.sql
ON CONFLICT (tenant_id, task_id, name) DO NOTHING
-- (No "due" here: Citus refuses now() in a RETURNING list; the caller knows it from $9.)
RETURNING name, kind, state, input_hash, result, wake_at;

-- name: step_ledger :many
-- Everything a handler's earlier runs recorded for task $2, in one read:
-- its steps (a wait's taken signal joined in) and its operations (the
-- effects, by idempotency key). Replaying k steps costs this one statement.
-- "due" is the database's own clock: a sleep or a wait's timeout has passed.
-- guarantee: G25, G13
-- zero rows: nothing recorded yet (a first run), or no such task in this tenant.
-- params: $1 tenant_id uuid, $2 task_id uuid
SELECT 'step' AS source, s.name, s.kind, s.state, s.input_hash, s.result, s.wake_at,
       s.wake_at <= now() AS due, NULL::text AS action, s.signal_seq,
       g.id AS signal_id, g.name AS signal_name, g.kind AS signal_kind, g.decision,
       g.payload AS signal_payload, g.sender, g.dedupe_key AS signal_dedupe_key,
       g.input_hash AS signal_input_hash, g.created_at AS signal_created_at
FROM agent_steps s
LEFT JOIN agent_signals g
       ON g.tenant_id = s.tenant_id AND g.task_id = s.task_id AND g.seq = s.signal_seq
      AND g.tenant_id = $1
WHERE s.tenant_id = $1 AND s.task_id = $2
UNION ALL
SELECT 'operation', o.idempotency_key, 'effect', o.state, o.input_hash, o.result, NULL, NULL,
       o.action, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM agent_operations o
WHERE o.tenant_id = $1 AND o.task_id = $2;

-- name: step_take_signal :one
-- Wait step $3 of task $2 takes the first signal named $4 that no step of
-- the task has taken, in seq order - recorded with it, done (a new row, or
-- the waiting one finished). Always one row: the signal taken (NULL when
-- none is there), the task's last signal seq (what a wait that sleeps moves
-- the cursor to: every signal of the name up to it is taken), and whether
-- the lease was current. agent_steps_signal_key lets each signal be taken
-- once, whoever writes.
-- guarantee: G25, G22, G12
-- zero rows: never; one row comes back.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 name text, $4 signal_name text, $5 input_hash text, $6 lease_owner text, $7 lease_token int8
WITH fence AS (
    SELECT t.id FROM agent_tasks t
    WHERE t.tenant_id = $1 AND t.id = $2
      AND t.lease_owner = $6 AND t.lease_token = $7  -- running: see "Held snapshots" in leases.sql
), sig AS (
    SELECT g.seq FROM agent_signals g, fence
    WHERE g.tenant_id = $1 AND g.task_id = $2 AND g.name = $4
      AND NOT EXISTS (SELECT 1 FROM agent_steps s
                      WHERE s.tenant_id = $1 AND s.task_id = $2 AND s.signal_seq = g.seq)
    ORDER BY g.seq
    LIMIT 1
), took AS (
    INSERT INTO agent_steps AS s (tenant_id, task_id, name, kind, state, input_hash, signal_seq,
                                  lease_token)
    SELECT $1, $2, $3, 'signal', 'done', $5, sig.seq, $7 FROM sig
    ON CONFLICT (tenant_id, task_id, name) DO UPDATE
    -- EXCLUDED's updated_at is the insert's now(): Citus refuses a function call here.
    SET state = 'done', signal_seq = EXCLUDED.signal_seq, lease_token = EXCLUDED.lease_token,
        updated_at = EXCLUDED.updated_at
    WHERE s.state = 'waiting' AND s.input_hash = EXCLUDED.input_hash
    RETURNING s.signal_seq
)
SELECT g.seq AS signal_seq, g.id AS signal_id, g.name AS signal_name, g.kind AS signal_kind,
       g.decision, g.payload AS signal_payload, g.sender, g.dedupe_key AS signal_dedupe_key,
       g.input_hash AS signal_input_hash, g.created_at AS signal_created_at,
       (SELECT coalesce(max(a.seq), 0) FROM agent_signals a
        WHERE a.tenant_id = $1 AND a.task_id = $2) AS last_seq,
       EXISTS (SELECT 1 FROM fence) AS leased
FROM (SELECT 1) AS one
LEFT JOIN took ON true
LEFT JOIN agent_signals g ON g.tenant_id = $1 AND g.task_id = $2 AND g.seq = took.signal_seq;
