-- Rollback 0018 cancel: the triggers and their function, 0015's distribution.

DROP TRIGGER agent_operations_for_open_task_retry ON agent_operations;
DROP TRIGGER agent_operations_for_open_task ON agent_operations;
DROP FUNCTION agentdb_guard_open_task();

DROP PROCEDURE agentdb_distribute(integer);
ALTER PROCEDURE agentdb_distribute_0015(integer) RENAME TO agentdb_distribute;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0017.rate_window_late'::text $$;

CALL agentdb_pin_search_paths();
