-- Operations: the effects a task attempts (G1, G13). reserve commits before
-- the provider is called; complete / fail / mark_unknown record what came
-- back. Each write checks the operation's state_version (G7) and, when the
-- caller holds the task's lease, that the lease is still theirs (G12): the
-- task row is locked FOR SHARE so a concurrent take-over waits or wins.
-- The *_many forms (operation_complete_many, operation_reserve_many) do the
-- same for many operations of claimed tasks in one statement, one commit,
-- each element keeping the guarantees of its one-row form.

-- name: operation_complete_many :many
-- operation_settle to 'succeeded' for many operations in one statement (one
-- commit): each element moves only if the operation is still unsettled
-- (reserved, in_flight or unknown) at its expected state_version and, when
-- the element names a lease, that lease on the operation's task is current
-- (the task row is locked FOR SHARE). Writes one event per operation
-- settled, and spends each settled operation's budget holds whole (G19:
-- operation_settle with no actual cost). Returns one row per settled
-- element, tagged with its 1-based position in the input (ord); an element
-- with no row was refused and nothing was written for it - the caller
-- reads the row again to say why.
-- guarantee: G7, G12, G13, G8, G19
-- params: $1 tenant_ids uuid[], $2 ids uuid[], $3 expected_versions int8[], $4 provider_references text[], $5 results jsonb[], $6 lease_owners text[], $7 lease_tokens int8[], $8 actor_id text
WITH input AS (
    SELECT i.ord, i.tenant_id, i.id, i.expected_version, i.provider_reference, i.result,
           i.lease_owner, i.lease_token
    FROM unnest($1::uuid[], $2::uuid[], $3::int8[], $4::text[], $5::jsonb[], $6::text[],
                $7::int8[])
         WITH ORDINALITY AS i (tenant_id, id, expected_version, provider_reference, result,
                               lease_owner, lease_token, ord)
), upd AS (
    UPDATE agent_operations o
    SET state = 'succeeded',
        state_version = o.state_version + 1,
        provider_reference = coalesce(i.provider_reference, o.provider_reference),
        result = coalesce(i.result, o.result),
        error = NULL,
        updated_at = now()
    FROM input i
    WHERE o.tenant_id = i.tenant_id AND o.id = i.id AND o.state_version = i.expected_version
      -- Unsettled, and the lease current (a task has an owner only while running:
      -- agent_tasks_running_is_leased), each said so that only the primary keys
      -- can find the rows: see "Held snapshots" in leases.sql.
      AND o.state NOT IN ('succeeded', 'failed')
      AND (i.lease_owner IS NULL OR EXISTS (
          SELECT 1 FROM agent_tasks t
          WHERE t.tenant_id = o.tenant_id AND t.id = o.task_id
            AND t.lease_owner = i.lease_owner AND t.lease_token = i.lease_token
          FOR SHARE))
    RETURNING i.ord, i.lease_owner AS settled_by, o.id, o.tenant_id, o.task_id,
              o.idempotency_key, o.action, o.input_hash, o.state, o.state_version,
              o.provider_reference, o.result, o.error, o.attempts, o.trace_id, o.span_id,
              o.created_at, o.updated_at
), hs AS (
    UPDATE agent_budget_holds h
    SET state = 'settled', settled = h.amount
    FROM upd u
    WHERE h.tenant_id = u.tenant_id AND h.operation_id = u.id AND h.state = 'held'
    RETURNING h.tenant_id, h.operation_id, h.budget_id, h.unit, h.amount
), bs AS (
    UPDATE agent_budgets b
    SET spent = b.spent + x.amount, held = b.held - x.amount, updated_at = now()
    FROM (SELECT tenant_id, budget_id, sum(amount) AS amount FROM hs
          GROUP BY tenant_id, budget_id) x
    WHERE b.tenant_id = x.tenant_id AND b.id = x.budget_id
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                              policy_version, to_state, operation_state_version, payload,
                              trace_id, span_id)
    SELECT u.tenant_id, u.task_id, u.id, 'operation.succeeded',
           coalesce($8, u.settled_by, 'agentdb'), t.workflow_version, u.state,
           u.state_version,
           jsonb_strip_nulls(jsonb_build_object(
               'provider_reference', u.provider_reference, 'attempts', u.attempts,
               'spent', (SELECT jsonb_object_agg(x.unit, x.amount) FROM hs x
                         WHERE x.tenant_id = u.tenant_id AND x.operation_id = u.id),
               -- Spent whole, nothing released: said, as operation_settle says it.
               'released', (SELECT jsonb_object_agg(x.unit, 0) FROM hs x
                            WHERE x.tenant_id = u.tenant_id AND x.operation_id = u.id))),
           u.trace_id, u.span_id
    FROM upd u JOIN agent_tasks t ON t.tenant_id = u.tenant_id AND t.id = u.task_id
)
SELECT ord, id, tenant_id, task_id, idempotency_key, action, input_hash, state,
       state_version, provider_reference, result, error, attempts, trace_id, span_id,
       created_at, updated_at
FROM upd
ORDER BY ord;

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

-- name: operation_reserve_many :many
-- operation_reserve for many keys of lease holders in one statement (one
-- commit). Each element is reserved only if its task is still running under
-- the element's lease ($7, $8); the task row is locked FOR SHARE, as in
-- operation_reserve, so a concurrent take-over waits or wins. Returns, with
-- the element's 1-based position (ord): created = true for a new reservation
-- (its event written), created = false with the row that already holds the
-- key (the caller compares input_hash, G4). An element with no row was not
-- reserved: its lease is no longer current (or its task is gone), or a
-- concurrent reservation of the same key committed after this statement's
-- snapshot - the caller checks the lease, else runs it again. The
-- statement's own inserts are invisible to its snapshot, so the lookup of
-- existing keys finds only rows that were there before.
-- Each element carries its own trace and span ids ($10, $11: G16), so the
-- operations of many tasks reserved together each lead to their own run.
-- guarantee: G3, G4, G12, G13, G16
-- params: $1 tenant_ids uuid[], $2 ids uuid[], $3 task_ids uuid[], $4 idempotency_keys text[], $5 actions text[], $6 input_hashes text[], $7 lease_owners text[], $8 lease_tokens int8[], $9 actor_id text, $10 trace_ids text[], $11 span_ids text[]
WITH input AS (
    SELECT i.ord, i.tenant_id, i.id, i.task_id, i.idempotency_key, i.action, i.input_hash,
           i.lease_owner, i.lease_token, i.trace_id, i.span_id
    FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::int8[], $10::text[], $11::text[])
         WITH ORDINALITY AS i (tenant_id, id, task_id, idempotency_key, action, input_hash,
                               lease_owner, lease_token, trace_id, span_id, ord)
), fence AS (
    SELECT i.ord, i.tenant_id, i.id, i.task_id, i.idempotency_key, i.action, i.input_hash,
           i.trace_id, i.span_id
    FROM input i
    JOIN agent_tasks t ON t.tenant_id = i.tenant_id AND t.id = i.task_id
    -- Running: only a running task has an owner (agent_tasks_running_is_leased);
    -- "Held snapshots" in leases.sql says why state is not named.
    WHERE t.lease_owner = i.lease_owner AND t.lease_token = i.lease_token
    FOR SHARE OF t
), ins AS (
    INSERT INTO agent_operations (id, tenant_id, task_id, idempotency_key, action, input_hash,
                                  trace_id, span_id)
    SELECT id, tenant_id, task_id, idempotency_key, action, input_hash, trace_id, span_id
    FROM fence
    ORDER BY ord
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, tenant_id, task_id, idempotency_key, action, input_hash, state,
              state_version, provider_reference, result, error, attempts, trace_id, span_id,
              created_at, updated_at
), ev AS (
    -- Joined to the task by its key (not to the CTEs), so the plan stays an
    -- index lookup per row whatever the batch size; the fence above made the
    -- task's lease owner the element's.
    INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                              policy_version, to_state, operation_state_version, payload,
                              trace_id, span_id)
    SELECT n.tenant_id, n.task_id, n.id, 'operation.reserved', coalesce($9, t.lease_owner),
           t.workflow_version, n.state, n.state_version,
           jsonb_build_object('action', n.action, 'idempotency_key', n.idempotency_key),
           n.trace_id, n.span_id
    FROM ins n JOIN agent_tasks t ON t.tenant_id = n.tenant_id AND t.id = n.task_id
)
SELECT array_position($2::uuid[], n.id)::int8 AS ord, true AS created, n.id, n.tenant_id,
       n.task_id, n.idempotency_key, n.action, n.input_hash, n.state, n.state_version,
       n.provider_reference, n.result, n.error, n.attempts, n.trace_id, n.span_id,
       n.created_at, n.updated_at
FROM ins n
UNION ALL
SELECT f.ord, false, o.id, o.tenant_id, o.task_id, o.idempotency_key, o.action,
       o.input_hash, o.state, o.state_version, o.provider_reference, o.result, o.error,
       o.attempts, o.trace_id, o.span_id, o.created_at, o.updated_at
FROM fence f
JOIN agent_operations o ON o.tenant_id = f.tenant_id AND o.idempotency_key = f.idempotency_key
ORDER BY ord;

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
