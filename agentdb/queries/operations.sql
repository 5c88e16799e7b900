-- Operations: the effects a task attempts (G1, G13). reserve commits before
-- the provider is called; complete / fail / mark_unknown record what came
-- back. Each write checks the operation's state_version (G7) and, when the
-- caller holds the task's lease, that the lease is still theirs (G12): the
-- task row is locked FOR SHARE so a concurrent take-over waits or wins.

-- name: operation_get :one
-- Read one operation of one tenant.
-- guarantee: G2
-- zero rows: no such operation in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT id, tenant_id, task_id, idempotency_key, action, input_hash, state, state_version,
       provider_reference, result, error, attempts, trace_id, span_id, created_at, updated_at
FROM agent_operations
WHERE tenant_id = $1 AND id = $2;

-- name: operation_list_unsettled :many
-- Operations left reserved, in flight or unknown whose task is not under a
-- live lease: the work recovery must reconcile, never blindly re-run (G13).
-- guarantee: G13
-- params: $1 older_than interval, $2 batch int8
SELECT o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action, o.input_hash, o.state,
       o.state_version, o.provider_reference, o.result, o.error, o.attempts, o.trace_id,
       o.span_id, o.created_at, o.updated_at
FROM agent_operations o
JOIN agent_tasks t ON t.tenant_id = o.tenant_id AND t.id = o.task_id
WHERE o.state IN ('reserved', 'in_flight', 'unknown')
  AND o.updated_at <= now() - $1::interval
  AND NOT (t.state = 'running' AND t.lease_expires_at > now())
ORDER BY o.updated_at
LIMIT $2;

-- name: operation_reserve :one
-- Reserve (tenant, idempotency key) for this input hash and write the event,
-- or return the row that already holds the key (created = false). The caller
-- compares input_hash: a different hash is a conflict, never a replay (G4).
-- With a lease ($8 not null) nothing is reserved unless the lease is current.
-- With a cost ($12 units, $13 amounts; NULL for none), the same statement
-- holds it on every budget of those units that covers the tenant or this
-- task (one plan, so concurrent reservations lock the same budgets in the
-- same order); the CHECK agent_budgets_within_limit refuses a hold that
-- takes a budget over its limit, and with it the whole statement: no
-- operation, no hold, no event. Nothing is held when the key already exists
-- (created = false). The event records the cost ($14, the same units and
-- amounts as a document).
-- guarantee: G3, G4, G12, G13, G19
-- zero rows: either the lease ($8, $9) is no longer current, or a concurrent reservation of the same key committed after this statement's snapshot; check the lease, else run it again.
-- params: $1 tenant_id uuid, $2 id uuid, $3 task_id uuid, $4 idempotency_key text, $5 action text, $6 input_hash text, $7 actor_id text, $8 lease_owner text, $9 lease_token int8, $10 trace_id text, $11 span_id text, $12 units text[], $13 amounts int8[], $14 cost jsonb
WITH fence AS (
    SELECT ($8::text IS NULL OR EXISTS (
        SELECT 1 FROM agent_tasks t
        WHERE t.tenant_id = $1 AND t.id = $3
          AND t.lease_owner = $8 AND t.lease_token = $9  -- running: see "Held snapshots" in leases.sql
        FOR SHARE)) AS ok
), ins AS (
    INSERT INTO agent_operations (id, tenant_id, task_id, idempotency_key, action, input_hash,
                                  trace_id, span_id)
    SELECT $2, $1, $3, $4, $5, $6, $10, $11 FROM fence WHERE fence.ok
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, tenant_id, task_id, idempotency_key, action, input_hash, state,
              state_version, provider_reference, result, error, attempts, trace_id, span_id,
              created_at, updated_at
), held AS (
    UPDATE agent_budgets b
    SET held = b.held + c.amount, updated_at = now()
    FROM unnest($12::text[], $13::int8[]) AS c (unit, amount)
    WHERE b.tenant_id = $1 AND b.unit = c.unit AND (b.task_id IS NULL OR b.task_id = $3)
      AND EXISTS (SELECT 1 FROM ins)
    RETURNING b.id, b.unit, c.amount
), hold AS (
    INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id, unit, amount)
    SELECT $1, i.id, i.attempts, h.id, h.unit, h.amount FROM ins i, held h
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                              policy_version, to_state, operation_state_version, payload,
                              trace_id, span_id)
    SELECT i.tenant_id, i.task_id, i.id, 'operation.reserved', $7, t.workflow_version, i.state,
           i.state_version, jsonb_strip_nulls(jsonb_build_object('action', i.action,
           'idempotency_key', i.idempotency_key, 'cost', $14::jsonb)),
           i.trace_id, i.span_id
    FROM ins i JOIN agent_tasks t ON t.tenant_id = $1 AND t.id = i.task_id
)
SELECT true AS created, id, tenant_id, task_id, idempotency_key, action, input_hash, state,
       state_version, provider_reference, result, error, attempts, trace_id, span_id,
       created_at, updated_at
FROM ins
UNION ALL
SELECT false, o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action, o.input_hash,
       o.state, o.state_version, o.provider_reference, o.result, o.error, o.attempts,
       o.trace_id, o.span_id, o.created_at, o.updated_at
FROM agent_operations o, fence
WHERE fence.ok AND o.tenant_id = $1 AND o.idempotency_key = $4
  AND NOT EXISTS (SELECT 1 FROM ins);

-- name: operation_settle :one
-- Record what happened to an operation: move it from one of the states in
-- $4 to $5 (succeeded, failed, unknown, in_flight, or reserved for a retry of
-- a failed one), with provider reference, result and error, if it is still
-- at the expected state_version and the caller's lease (if any) is current.
-- Writes the event. A retry (reserved) counts an attempt. Settling it
-- (succeeded or failed) settles its budget holds in the same statement
-- (G19): succeeded spends the actual cost ($13 units, $14 amounts; a unit
-- not named spends its whole hold) and releases the rest, failed releases
-- every hold; the event records both. Other moves leave the holds held.
-- guarantee: G7, G12, G13, G8, G19
-- zero rows: the operation is gone, in another state, at another version, or the caller's lease was taken over; reload before deciding anything.
-- params: $1 tenant_id uuid, $2 id uuid, $3 expected_version int8, $4 from_states text[], $5 to_state text, $6 provider_reference text, $7 result jsonb, $8 error text, $9 actor_id text, $10 lease_owner text, $11 lease_token int8, $12 event_type text, $13 units text[], $14 amounts int8[]
WITH upd AS (
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
      AND ($10::text IS NULL OR EXISTS (
          SELECT 1 FROM agent_tasks t
          WHERE t.tenant_id = $1 AND t.id = o.task_id
            AND t.lease_owner = $10 AND t.lease_token = $11
          FOR SHARE))
    RETURNING o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action, o.input_hash,
              o.state, o.state_version, o.provider_reference, o.result, o.error, o.attempts,
              o.trace_id, o.span_id, o.created_at, o.updated_at
), hs AS (
    UPDATE agent_budget_holds h
    SET state = CASE WHEN u.state = 'succeeded' THEN 'settled' ELSE 'released' END,
        settled = CASE WHEN u.state = 'succeeded' THEN coalesce(
            (SELECT a.amount FROM unnest($13::text[], $14::int8[]) AS a (unit, amount)
             WHERE a.unit = h.unit), h.amount) END
    FROM upd u
    WHERE h.tenant_id = $1 AND h.operation_id = u.id AND h.state = 'held'
      AND u.state IN ('succeeded', 'failed')
    RETURNING h.budget_id, h.unit, h.amount, h.settled
), bs AS (
    UPDATE agent_budgets b
    SET spent = b.spent + x.settled, held = b.held - x.amount, updated_at = now()
    FROM (SELECT budget_id, sum(amount) AS amount, sum(coalesce(settled, 0)) AS settled
          FROM hs GROUP BY budget_id) x
    WHERE b.tenant_id = $1 AND b.id = x.budget_id
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                              policy_version, to_state, operation_state_version, payload,
                              trace_id, span_id)
    SELECT u.tenant_id, u.task_id, u.id, $12, $9, t.workflow_version, u.state,
           u.state_version,
           jsonb_strip_nulls(jsonb_build_object(
               'provider_reference', u.provider_reference, 'attempts', u.attempts,
               'spent', (SELECT jsonb_object_agg(x.unit, x.settled) FROM hs x
                         WHERE x.settled IS NOT NULL),
               'released', (SELECT jsonb_object_agg(x.unit, x.amount - coalesce(x.settled, 0))
                            FROM hs x))),
           u.trace_id, u.span_id
    -- The tenant as a constant ($1, not u.tenant_id): Citus then reads one
    -- shard of agent_tasks, not all of them; the same on plain Postgres.
    FROM upd u JOIN agent_tasks t ON t.tenant_id = $1 AND t.id = u.task_id
)
SELECT id, tenant_id, task_id, idempotency_key, action, input_hash, state, state_version,
       provider_reference, result, error, attempts, trace_id, span_id, created_at, updated_at
FROM upd;
