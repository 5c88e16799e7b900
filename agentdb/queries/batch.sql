-- Batched reserve and complete (agentdb.batch): one statement, one commit,
-- for many operations of claimed tasks, each element keeping the guarantees
-- of its one-row form in operations.sql.

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
