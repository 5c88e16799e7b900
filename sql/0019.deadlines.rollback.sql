-- Rollback 0019 deadlines: the sweep's index, the guard, the column.

DROP INDEX agent_tasks_deadline_idx;

-- 0018's guard, which knows no deadline.
CREATE OR REPLACE FUNCTION agentdb_guard_open_task() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    task_state text;
BEGIN
    SELECT t.state INTO task_state FROM agent_tasks t
    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
    FOR SHARE;
    IF task_state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; nothing more is reserved for it',
                NEW.task_id, task_state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_guard_open_task() SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;
DROP TRIGGER agent_tasks_deadline_guard ON agent_tasks;
DROP FUNCTION agentdb_guard_deadline();
ALTER TABLE agent_tasks DROP COLUMN deadline_at;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0018.cancel'::text $$;

CALL agentdb_pin_search_paths();
