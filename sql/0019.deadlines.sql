-- 0019 deadlines: after a task's deadline_at, nothing moves it but the way
-- out - dead (the deadline) or cancelled (G21).
-- depends: 0018.cancel
-- phase: expand
--
-- A task may carry deadline_at. Once the deadline has passed the claim path
-- no longer takes it (agentdb/queries/leases.sql), and the database refuses
-- every write that would keep it alive - a claim, a finish (succeeded or
-- failed), a step, a release back to pending or waiting, a lease renewed or
-- handed over - whoever writes it (AG013); the only moves left are to 'dead'
-- (which the sweep, lease_expire_deadlines, makes with its event
-- task.deadline_passed) and to 'cancelled'. So a passed deadline never
-- moves either (that write keeps the task alive too), or a late finish could
-- be let in by extending it. A write's instant is its transaction's start,
-- now(), as for every timestamp the write records: a finish whose
-- transaction began before the deadline finished before it.
--
-- Adding a nullable column without a default rewrites nothing; the guard
-- runs only for unfinished rows that carry a deadline (its WHEN clause), so
-- tasks without one pay nothing, and a finished task's deadline is history.

-- G21
ALTER TABLE agent_tasks ADD COLUMN deadline_at timestamptz;

-- G21
CREATE FUNCTION agentdb_guard_deadline() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.deadline_at > now() THEN
        RETURN NEW;
    END IF;
    -- Whatever else the write changes - the state, a step, the deadline itself
    -- (pushed back to let a late finish in) - only an end gets through.
    IF NEW.state NOT IN ('dead', 'cancelled') THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it can only be moved to dead '
                        'or cancelled, not to %', OLD.id, OLD.deadline_at, NEW.state
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- Citus: a trigger on a distributed table reaches its shards only with this
-- setting (as agentdb_distribute() does for the others).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$$;

-- G21: every UPDATE, not only of state: a step, a lease renewed or handed
-- over, are writes that keep a task alive too. Only an unfinished task with
-- a deadline calls the function.
CREATE TRIGGER agent_tasks_deadline_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (OLD.deadline_at IS NOT NULL AND OLD.state IN ('pending', 'waiting', 'running'))
    EXECUTE FUNCTION agentdb_guard_deadline();

-- G20, G21: 0018's guard on new and re-armed operations, which now also
-- refuses one for a task past its deadline (AG013): a late task starts no
-- new effect. (CREATE OR REPLACE drops the function's settings: on a
-- distributed schema the one agentdb_distribute() gives it is set again.)
CREATE OR REPLACE FUNCTION agentdb_guard_open_task() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    task_state text;
    task_deadline timestamptz;
BEGIN
    SELECT t.state, t.deadline_at INTO task_state, task_deadline FROM agent_tasks t
    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
    FOR SHARE;
    IF task_state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; nothing more is reserved for it',
                NEW.task_id, task_state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task_deadline <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; nothing more is reserved '
                        'for it', NEW.task_id, task_deadline
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
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

-- G21: the sweep's path to unfinished tasks whose deadline passed.
CREATE INDEX agent_tasks_deadline_idx ON agent_tasks (deadline_at)
    WHERE deadline_at IS NOT NULL AND state IN ('pending', 'waiting', 'running');

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0019.deadlines'::text $$;

CALL agentdb_pin_search_paths();
