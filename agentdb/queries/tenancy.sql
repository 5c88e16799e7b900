-- Tenants: registration, per-transaction scope for row-level security (G15)
-- and the deletion policy (G17).

-- name: tenant_by_name :one
-- The tenant called $1 (names are unique: agent_tenants_name_key).
-- guarantee: G2
-- zero rows: no tenant has that name (or the caller's role may not see it).
-- params: $1 name text
SELECT id, name, state, created_at
FROM agent_tenants
WHERE name = $1;

-- name: tenant_create :one
-- Register a tenant. Every tenant-owned row references one (G2). A name is
-- one tenant's (agent_tenants_name_key): a create with a name that is taken
-- inserts nothing and answers with the tenant that has it (created = false),
-- so a retried create, or two racing, make one tenant.
-- guarantee: G2
-- zero rows: a concurrent create committed the same name after this statement's snapshot was taken; run it again.
-- params: $1 id uuid, $2 name text
WITH ins AS (
    INSERT INTO agent_tenants (id, name)
    VALUES ($1, $2)
    ON CONFLICT (name) DO NOTHING
    RETURNING id, name, state, created_at
)
SELECT true AS created, id, name, state, created_at FROM ins
UNION ALL
SELECT false, t.id, t.name, t.state, t.created_at
FROM agent_tenants t
WHERE t.name = $2 AND NOT EXISTS (SELECT 1 FROM ins);

-- name: tenant_delete :many
-- Apply (or, with $2, only count) the tenant deletion policy of
-- agentdb_delete_tenant: one row per step, in order. Owner only: the runtime
-- and agent roles may not execute it.
-- guarantee: G17
-- params: $1 tenant_id uuid, $2 dry_run bool, $3 actor_id text
SELECT step, object, action, affected, retained_until, refs
FROM agentdb_delete_tenant($1, $2, $3);

-- name: tenant_limit_set :one
-- Cap how many of a tenant's tasks run at once: all of them ($2 = '*') or
-- one task type. NULL lifts the cap, 0 pauses. A lowered cap stops new
-- starts; tasks already running finish normally.
-- guarantee: G18
-- zero rows: never (the upsert returns its row or raises).
-- params: $1 tenant_id uuid, $2 task_type text, $3 max_running int4
INSERT INTO agent_concurrency_limits (tenant_id, task_type, max_running)
VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, task_type)
DO UPDATE SET max_running = EXCLUDED.max_running, updated_at = EXCLUDED.updated_at
RETURNING tenant_id;

-- name: tenant_limits :many
-- A tenant's caps and how many of its tasks each one counts as running now.
-- guarantee: G18
-- zero rows: the tenant has no caps (it is unlimited).
-- params: $1 tenant_id uuid
SELECT l.task_type, l.max_running, agentdb_running_count(l.tenant_id, l.task_type) AS running
FROM agent_concurrency_limits l
WHERE l.tenant_id = $1
ORDER BY l.task_type;

-- name: tenant_list :many
-- Every tenant the caller may see, by name.
-- guarantee: G2
-- zero rows: there are no tenants (or the caller's role sees none).
-- params: $1 limit int8
SELECT id, name, state, created_at
FROM agent_tenants
ORDER BY name
LIMIT $1;

-- name: tenant_scope_set :one
-- Scope the current transaction to one tenant for the agentdb_agent role's
-- row-level security. SET LOCAL (inside agentdb_scope_tenant, which also
-- makes Citus pass it to the workers): the setting ends with the
-- transaction and never leaks to the next user of a pooled connection.
-- guarantee: G15
-- zero rows: never (a function call returns one row).
-- params: $1 tenant_id uuid
SELECT agentdb_scope_tenant($1);
