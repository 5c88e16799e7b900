-- Retention (G9): one short, resumable purge step at a time.

-- name: event_partitions :many
-- Create the month partitions of agent_events from this month to $1 months
-- on, and drop each month that is over and holds no retained row
-- (agentdb_event_partitions, sql/migrations/0011.retention.sql): one row per
-- month created, left in
-- the DEFAULT partition (rows of it are already there), dropped, or skipped
-- because its lock was not granted in time.
-- guarantee: G9
-- zero rows: every month wanted exists and none can go.
-- params: $1 ahead int4
SELECT partition_name, action, events FROM agentdb_event_partitions($1);

-- name: purge_step :one
-- Remove at most $2 rows of retention class $1 in one short statement (see
-- agentdb_purge in sql/migrations/0011.retention.sql); returns how many.
-- guarantee: G9
-- zero rows: never (a function call returns one row).
-- params: $1 kind text, $2 batch int4, $3 older_than interval
SELECT agentdb_purge($1, $2, $3) AS removed;

-- name: purge_tenant_step :one
-- purge_step for tenant $1 alone (agentdb_purge_tenant): on
-- Citus each step then routes to the tenant's worker.
-- guarantee: G9
-- zero rows: never (a function call returns one row).
-- params: $1 tenant_id uuid, $2 kind text, $3 batch int4, $4 older_than interval
SELECT agentdb_purge_tenant($1, $2, $3, $4) AS removed;

-- name: purge_tenants :many
-- Every tenant, for a purge that runs tenant by tenant (on Citus).
-- guarantee: G9
-- params: none
SELECT id AS tenant_id FROM agent_tenants ORDER BY id;
