-- Tenant scope for row-level security (G15).

-- name: tenant_scope_set :one
-- Scope the current transaction to one tenant for the agentdb_agent role's
-- row-level security. is_local = true: the setting ends with the
-- transaction and never leaks to the next user of a pooled connection.
-- guarantee: G15
-- zero rows: never (SELECT without FROM returns one row).
-- params: $1 tenant_id text
SELECT set_config('agentdb.tenant_id', $1, true);

-- name: tenant_create :one
-- Register a tenant. Every tenant-owned row references one (G2).
-- guarantee: G2
-- zero rows: never (an INSERT without ON CONFLICT returns its row or raises).
-- params: $1 id uuid, $2 name text
INSERT INTO agent_tenants (id, name)
VALUES ($1, $2)
RETURNING id;
