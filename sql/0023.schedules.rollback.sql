-- Back to 0022: no schedules. The tasks they made stay, as plain tasks; what
-- fired them is in their creation events.
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_schedules();
ALTER PROCEDURE agentdb_distribute_0022(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
ALTER FUNCTION agentdb_delete_tenant_0020(uuid, boolean, text) RENAME TO agentdb_delete_tenant;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_schedules FROM agentdb_runtime;
    END IF;
END
$$;
DROP PROCEDURE agentdb_grant_roles();
ALTER PROCEDURE agentdb_grant_roles_0020() RENAME TO agentdb_grant_roles;
DROP TRIGGER agent_tasks_schedule_guard ON agent_tasks;
DROP TRIGGER agent_tasks_schedule_fixed ON agent_tasks;
DROP FUNCTION agentdb_guard_schedule_tick();
DROP FUNCTION agentdb_fire_schedule(uuid, uuid);
DROP FUNCTION agentdb_pause_schedule(uuid, text, boolean);
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_schedule_tick_valid;
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_schedule_tick_key;
ALTER TABLE agent_tasks DROP COLUMN schedule_tick;
ALTER TABLE agent_tasks DROP COLUMN schedule_id;
DROP TABLE agent_schedules;
DROP FUNCTION agentdb_schedule_is_tick(interval, text, timestamptz, timestamptz);
DROP FUNCTION agentdb_schedule_tick(interval, text, timestamptz, timestamptz, boolean);
DROP FUNCTION agentdb_cron_tick(text, timestamptz, boolean);
DROP FUNCTION agentdb_cron_valid(text);
DROP FUNCTION agentdb_cron_field(text, integer, integer);

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0022.wait_rules'::text $$;

CALL agentdb_pin_search_paths();
