-- Back to 0012: the routines go; a schema already distributed stays so
-- (Citus has undistribute_table for that, table by table).
DROP PROCEDURE agentdb_distribute(integer);
DROP FUNCTION agentdb_distributed();
DROP FUNCTION agentdb_scope_tenant(uuid);
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0012.fair_claim'::text $$;

CALL agentdb_pin_search_paths();
