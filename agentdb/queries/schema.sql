-- The schema's own account of which migration it is at (agentdb.schema.check).

-- name: schema_has_agentdb :one
-- Whether any migration reached this schema: its first table, or yoyo's record of migrations.
-- Read only after schema_version failed, to tell an empty schema from an older one.
-- guarantee: none
-- zero rows: never (a SELECT without FROM returns one row)
-- params: none
SELECT to_regclass('agent_tenants') IS NOT NULL
    OR to_regclass('_yoyo_migration') IS NOT NULL AS migrated;

-- name: schema_version :one
-- The newest migration applied to this schema (the newest migration defines it).
-- guarantee: none
-- zero rows: never (a function call returns one row); a schema not migrated to the end has no
-- such function.
-- params: none
SELECT agentdb_schema_version() AS version;
