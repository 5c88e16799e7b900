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

-- name: tenant_delete :many
-- Apply (or, with $2, only count) the tenant deletion policy of
-- agentdb_delete_tenant: one row per step, in order. Owner only: the runtime
-- and agent roles may not execute it.
-- guarantee: G17
-- params: $1 tenant_id uuid, $2 dry_run bool, $3 actor_id text
SELECT step, object, action, affected, retained_until, refs
FROM agentdb_delete_tenant($1, $2, $3);

-- name: semconv_pin :many
-- Append a GenAI semantic-conventions pin unless it is already the latest.
-- One row: pinned now. No row: it already was.
-- guarantee: G16
-- params: $1 version text
INSERT INTO agent_semconv_pins (version)
SELECT $1
WHERE $1 IS DISTINCT FROM (SELECT version FROM agent_semconv_pins ORDER BY since DESC LIMIT 1)
RETURNING since;

-- name: semconv_latest :many
-- The latest GenAI semantic-conventions pin (no row: never pinned).
-- guarantee: G16
-- params: none
SELECT version, since FROM agent_semconv_pins ORDER BY since DESC LIMIT 1;

-- name: purge_step :one
-- Remove at most $2 rows of retention class $1 in one short statement (see
-- agentdb_purge in sql/0010.retention.sql); returns how many.
-- guarantee: G9
-- zero rows: never (a function call returns one row).
-- params: $1 kind text, $2 batch int4, $3 older_than interval
SELECT agentdb_purge($1, $2, $3) AS removed;
