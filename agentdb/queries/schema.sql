-- The schema's own account of which migration it is at (agentdb.schema.check).

-- name: schema_distributed :one
-- Whether this schema's tables are distributed by Citus (0013 and later):
-- the runtime then runs its per-tenant, single-shard statement forms.
-- guarantee: none
-- zero rows: never (a function call returns one row); a schema older than 0013 has no such function.
-- params: none
SELECT agentdb_distributed() AS distributed;

-- name: schema_version :one
-- The newest migration applied to this schema (0011 and later record it).
-- guarantee: none
-- zero rows: never (a function call returns one row); a schema older than 0011 has no such function.
-- params: none
SELECT agentdb_schema_version() AS version;
