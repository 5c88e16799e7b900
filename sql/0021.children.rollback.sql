-- Back to 0020: no children. A child's row stays, as a plain task.
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_children();
ALTER PROCEDURE agentdb_distribute_0020(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0020(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0020(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_tasks(uuid, integer, interval);
DROP TRIGGER agent_tasks_child_guard ON agent_tasks;
DROP TRIGGER agent_tasks_fan_in ON agent_tasks;
DROP TRIGGER agent_tasks_children_guard ON agent_tasks;
DROP TRIGGER agent_tasks_keep_parent ON agent_tasks;
DROP FUNCTION agentdb_guard_child();
DROP FUNCTION agentdb_fan_in();
DROP FUNCTION agentdb_guard_children_wait();
DROP FUNCTION agentdb_keep_parent();
DROP FUNCTION agentdb_children_done(uuid, uuid);
ALTER TABLE agent_tasks DROP COLUMN wait_children;
ALTER TABLE agent_tasks DROP COLUMN child_key;
ALTER TABLE agent_tasks DROP COLUMN parent_id;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0020.signals'::text $$;

CALL agentdb_pin_search_paths();
