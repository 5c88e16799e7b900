-- The schema's own account of which migration it is at (agentdb.schema.check).

-- name: schema_version :one
-- The newest migration applied to this schema (the newest migration defines it).
-- guarantee: none
-- zero rows: never (a function call returns one row); a schema not migrated to the end has no
-- such function.
-- params: none
SELECT agentdb_schema_version() AS version;
