-- Tenants: registration, per-transaction scope for row-level security (G15)
-- and the deletion policy (G17).

-- name: tenant_create :one
-- Register a tenant. Every tenant-owned row references one (G2).
-- guarantee: G2
-- zero rows: never (an INSERT without ON CONFLICT returns its row or raises).
-- params: $1 id uuid, $2 name text
INSERT INTO agent_tenants (id, name)
VALUES ($1, $2)
RETURNING id;

-- name: tenant_delete :many
-- Apply (or, with $2, only count) the tenant deletion policy of
-- agentdb_delete_tenant: one row per step, in order. Owner only: the runtime
-- and agent roles may not execute it.
-- guarantee: G17
-- params: $1 tenant_id uuid, $2 dry_run bool, $3 actor_id text
SELECT step, object, action, affected, retained_until, refs
FROM agentdb_delete_tenant($1, $2, $3);

-- name: tenant_scope_set :one
-- Scope the current transaction to one tenant for the agentdb_agent role's
-- row-level security. is_local = true: the setting ends with the
-- transaction and never leaks to the next user of a pooled connection.
-- guarantee: G15
-- zero rows: never (SELECT without FROM returns one row).
-- params: $1 tenant_id text
SELECT set_config('agentdb.tenant_id', $1, true);
