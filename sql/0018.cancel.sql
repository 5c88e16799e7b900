-- 0018 cancel: a cancelled task stays cancelled, and nothing more is
-- reserved for a finished task (G20).
-- depends: 0017.rate_window_late
-- phase: expand
--
-- agentdb.tasks.cancel moves a task to 'cancelled' in one versioned write
-- with its event (task.cancelled), whatever state it is in and whoever holds
-- it: leaving 'running' drops the lease in the same write, so the holder's
-- next renew, reserve, settle or finish matches no row (its fence names the
-- lease it no longer has) and the runtime raises Cancelled. 'cancelled' has
-- no way out in agent_transitions, so no later write revives the task.
--
-- What the fences cannot see is a writer that does not present a lease: a
-- raw INSERT of an operation, or a raw re-arm of a failed one, for a task
-- that has finished. The triggers below refuse both (AG012), so a cancel is
-- final for every writer, not only for the runtime. They lock the task row
-- FOR SHARE: a cancel (which updates the row) and a reservation serialise,
-- and whichever commits second sees the other. Operations reserved before
-- the cancel stay as they are, in the ledger, for reconcile: a cancel never
-- makes an effect disappear.
--
-- The triggers run AFTER the row is written, so a replayed reservation (its
-- key already taken: ON CONFLICT DO NOTHING inserts nothing) still returns
-- the operation that holds the key. They fire before agent_operations_rate_limit
-- (triggers fire in name order), so a reservation for a finished task is
-- reported as that, not as a rate limit, and takes no lock on the limit's row
-- (either refusal undoes the whole statement, its count included).

-- G20
CREATE FUNCTION agentdb_guard_open_task() RETURNS trigger
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

-- Citus: a trigger on a distributed table is created on its shards only
-- with this setting (as agentdb_distribute() does for the others).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$$;

-- G20, G21: a new operation for a finished task (or, from 0019 on, one past its deadline).
CREATE TRIGGER agent_operations_for_open_task
    AFTER INSERT ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_open_task();
-- G20, G21: a failed operation re-armed for a finished task (from 0019: or a late one).
CREATE TRIGGER agent_operations_for_open_task_retry
    AFTER UPDATE OF state ON agent_operations
    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')
    EXECUTE FUNCTION agentdb_guard_open_task();

-- 0015's distribution (kept as agentdb_distribute_0015); the guard then reads
-- the task's colocated shard from inside the operation shard's trigger.
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0015;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_distribute_0015(p_shard_count);
    ALTER FUNCTION agentdb_guard_open_task() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0015(integer) FROM PUBLIC;

DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_guard_open_task() SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0018.cancel'::text $$;

CALL agentdb_pin_search_paths();
