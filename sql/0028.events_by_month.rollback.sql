-- Back to 0027: agent_events as one table again if it was partitioned
-- (agentdb_unpartition_events() copies every row back), 0028's routines gone.

CALL agentdb_unpartition_events();
DROP PROCEDURE agentdb_partition_events();
DROP PROCEDURE agentdb_unpartition_events();
DROP FUNCTION agentdb_event_partitions(integer);
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0027(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0027(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP PROCEDURE agentdb_distribute(integer);
ALTER PROCEDURE agentdb_distribute_0027(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_event_records_once();
DROP FUNCTION agentdb_require_event_by_month();
DROP PROCEDURE agentdb_distribute_like(regclass, regclass);
DROP PROCEDURE agentdb_move_access(regclass, regclass, boolean);

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0027.call_instant'::text $$;

CALL agentdb_pin_search_paths();
