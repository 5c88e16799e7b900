-- Back to 0019: no signals; the routines of 0014 and 0018 under their own
-- names again. What the signals were is still in their events.
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_signals();
ALTER PROCEDURE agentdb_distribute_0018(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0014(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0014(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_signals(uuid, text, interval);
DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
ALTER FUNCTION agentdb_delete_tenant_0014(uuid, boolean, text) RENAME TO agentdb_delete_tenant;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_signals FROM agentdb_runtime;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        REVOKE ALL ON agent_signals FROM agentdb_agent;
    END IF;
END
$$;
DROP PROCEDURE agentdb_grant_roles();
ALTER PROCEDURE agentdb_grant_roles_0014() RENAME TO agentdb_grant_roles;
DROP TRIGGER agent_tasks_signal_guard ON agent_tasks;
DROP TABLE agent_signals;
DROP FUNCTION agentdb_guard_signal();
DROP FUNCTION agentdb_deliver_signal();
DROP FUNCTION agentdb_guard_signal_immutable();
DROP FUNCTION agentdb_guard_signal_cursor();
ALTER TABLE agent_tasks DROP COLUMN wait_signal;
ALTER TABLE agent_tasks DROP COLUMN signal_cursor;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0019.deadlines'::text $$;

CALL agentdb_pin_search_paths();
