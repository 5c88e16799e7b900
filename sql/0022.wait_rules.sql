-- 0022 wait rules: the signals of 0020 and the fan-in of 0021 hold whatever
-- the caller's isolation level, role or path (G22, G23).
-- depends: 0021.children
-- phase: expand
--
-- What a review of 0020 and 0021 found, and what this migration changes:
--
--   * Isolation. The wake-ups count what committed before a row lock, in a
--     snapshot taken after it. Only READ COMMITTED takes a new snapshot per
--     statement: under REPEATABLE READ or SERIALIZABLE a wait could sleep on
--     a signal it cannot see, and the last two children finishing at once
--     could each count the other as unfinished - nobody wakes the parent.
--     Those paths now refuse any other level (AG015, AG016) where it
--     would matter: every signal, a wait that would sleep, a fan-in count.
--   * A role that cannot see a task learns nothing about it by signalling it:
--     agent_signals_access (as the sender, under its row-level security)
--     refuses a task it cannot see as if it did not exist (23503), before
--     agent_signals_guard (as the owner) locks the task and says whether it
--     is finished or late. Neither leaves a missing task to the foreign key
--     any more: it checks at the end of the statement, and a task created
--     meanwhile (a slow multi-row INSERT ... SELECT) passed it unguarded.
--   * An approval by anyone who ever held the task's lease is refused, not
--     only by its current holder (a holder that waited has released it). The
--     sender is what the caller says it is: the database cannot tell two
--     services apart that connect as one role.
--   * A child key's dedupe key ('child/<parent>/<key>') is reserved: no other
--     task may take it, so no one can squat a child's place before its parent
--     creates it. (Applying this fails, naming the CHECK, if a row already
--     squats one: find them with dedupe_key LIKE 'child/%' AND child_key IS NULL.)
--   * A parent past its deadline takes no new child (AG013, as its signals).
--   * The fan-in locks the parent FOR NO KEY UPDATE, which still makes
--     siblings take turns but no longer blocks foreign-key checks on it.
--   * The signals of finished tasks are a retention class of their own
--     ('signals'), purged in bounded batches before the tasks they refer to;
--     the tasks purge skips a task with signals left.

-- G22, G23: the wake-ups need a snapshot per statement. p_code: AG015 for
-- a signal's rules (G22), AG016 for a fan-in's (G23).
CREATE FUNCTION agentdb_require_read_committed(p_code text, p_object text, p_table text)
    RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'agentdb: % counts what committed before its lock, which a % transaction cannot see',
                p_object, current_setting('transaction_isolation')
            USING ERRCODE = p_code, CONSTRAINT = p_object, TABLE = p_table,
                  HINT = 'Run it at READ COMMITTED (the default isolation level).';
    END IF;
END
$$;

-- G22, G2: as the sender, under its row-level security. A task it cannot see
-- is refused here, as the foreign key would refuse a task that does not
-- exist - and before agent_signals_guard (as the owner, next by name) locks
-- it and says whether it is finished or late. Not left to the foreign key:
-- that looks at the end of the statement, when a task created meanwhile
-- would pass it with the guard's checks skipped.
-- Its messages name the constraint as Postgres's own foreign-key errors do:
-- Citus drops the CONSTRAINT field of a worker's error, and the driver layer
-- then reads the name from the message (agentdb/_db/execute.py).
CREATE FUNCTION agentdb_signal_access() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = NEW.tenant_id) THEN
        RAISE EXCEPTION 'agentdb: no tenant % to signal in (violates foreign key constraint "agent_signals_tenant_fkey")',
                        NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_tenant_fkey',
                  TABLE = TG_TABLE_NAME;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent_tasks k
                   WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id) THEN
        RAISE EXCEPTION 'agentdb: no task % in tenant % to signal (violates foreign key constraint "agent_signals_task_fkey")',
                        NEW.task_id, NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_task_fkey',
                  TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G22: lock the task, refuse what it may not take, give the signal its place.
-- SECURITY DEFINER: the agent role sends signals but may not lock tasks.
CREATE OR REPLACE FUNCTION agentdb_guard_signal() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task record;
BEGIN
    PERFORM agentdb_require_read_committed('AG015', TG_NAME, TG_TABLE_NAME);
    SELECT k.state, k.deadline_at, k.lease_owner INTO task FROM agent_tasks k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN  -- deleted since agent_signals_access saw it
        RAISE EXCEPTION 'agentdb: no task % in tenant % to signal (violates foreign key constraint "agent_signals_task_fkey")',
                        NEW.task_id, NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_task_fkey',
                  TABLE = TG_TABLE_NAME;
    END IF;
    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it takes no more signals', NEW.task_id, task.state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task.deadline_at <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it takes no more signals',
                NEW.task_id, task.deadline_at
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    -- The claim events name every holder the task had (actor_id = lease_owner).
    IF NEW.kind = 'approval' AND (NEW.sender = task.lease_owner
        OR EXISTS (SELECT 1 FROM agent_events e
                   WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id
                     AND e.event_type IN ('task.claimed', 'task.reclaimed')
                     AND e.actor_id = NEW.sender)) THEN
        RAISE EXCEPTION 'agentdb: % holds or held task % and cannot approve its own work',
                NEW.sender, NEW.task_id
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    -- Read under the lock, in a snapshot taken after it: every signal that
    -- committed before this one is counted.
    NEW.seq := 1 + coalesce((SELECT max(s.seq) FROM agent_signals s
                             WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.task_id), 0);
    RETURN NEW;
END
$$;

-- G22: the cursor only grows, never past the last signal; a wait for a
-- signal that is already there (unread) is due at once. A wait that sleeps
-- must have looked in a snapshot taken after its row lock.
CREATE OR REPLACE FUNCTION agentdb_guard_signal_cursor() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF NEW.signal_cursor < OLD.signal_cursor THEN
        RAISE EXCEPTION 'agentdb: the signal cursor of task % moves back (% -> %)',
                NEW.id, OLD.signal_cursor, NEW.signal_cursor
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.signal_cursor > OLD.signal_cursor
       AND NOT EXISTS (SELECT 1 FROM agent_signals s
                       WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                         AND s.seq = NEW.signal_cursor) THEN
        RAISE EXCEPTION 'agentdb: task % has no signal % to have read', NEW.id, NEW.signal_cursor
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.state = 'waiting' AND NEW.wait_signal IS NOT NULL AND NEW.wake_at > now() THEN
        IF EXISTS (SELECT 1 FROM agent_signals s
                   WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal) THEN
            NEW.wake_at := now();
        ELSE
            PERFORM agentdb_require_read_committed('AG015', TG_NAME, TG_TABLE_NAME);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- G23, G20, G21: a finished parent, or one past its deadline, takes no new child.
CREATE OR REPLACE FUNCTION agentdb_guard_child() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    parent record;
BEGIN
    SELECT p.state, p.deadline_at INTO parent FROM agent_tasks p
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    FOR SHARE;
    IF parent.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it takes no new child', NEW.parent_id, parent.state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF parent.deadline_at <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it takes no new child',
                NEW.parent_id, parent.deadline_at
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G23: a child finished - wake its parent if it was the one the parent waited for.
CREATE OR REPLACE FUNCTION agentdb_fan_in() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    parent record;
    woken record;
BEGIN
    -- The lock first, the count after it (a new snapshot): siblings finishing at
    -- once take turns here, and the last one counts them all.
    SELECT p.state, p.wait_children, p.deadline_at INTO parent FROM agent_tasks p
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    FOR NO KEY UPDATE;
    -- A parent past its deadline is not woken (G21 would refuse it, and with it
    -- the child's finish): the sweep ends it.
    IF parent.state IS DISTINCT FROM 'waiting' OR parent.wait_children IS NULL
       OR parent.deadline_at <= now() THEN
        RETURN NULL;
    END IF;
    PERFORM agentdb_require_read_committed('AG016', TG_NAME, TG_TABLE_NAME);
    IF agentdb_children_done(NEW.tenant_id, NEW.parent_id) < parent.wait_children THEN
        RETURN NULL;
    END IF;
    UPDATE agent_tasks p
    SET state = 'pending', state_version = p.state_version + 1, wake_at = now(),
        wait_children = NULL, updated_at = now()
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    RETURNING p.state_version, p.workflow_version, p.trace_id, p.span_id INTO woken;
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload,
                              trace_id, span_id)
    VALUES (NEW.tenant_id, NEW.parent_id, 'task.children_done', 'agentdb', woken.workflow_version,
            'waiting', 'pending', woken.state_version,
            jsonb_build_object('waited_for', parent.wait_children, 'last_child', NEW.id),
            woken.trace_id, woken.span_id);
    RETURN NULL;
END
$$;

-- G23: a wait for children that have finished already is due at once; one
-- that sleeps must have counted in a snapshot taken after its row lock.
CREATE OR REPLACE FUNCTION agentdb_guard_children_wait() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.wake_at > now() THEN
        IF agentdb_children_done(NEW.tenant_id, NEW.id) >= NEW.wait_children THEN
            NEW.wake_at := now();
        ELSE
            PERFORM agentdb_require_read_committed('AG016', TG_NAME, TG_TABLE_NAME);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- G23: a child's dedupe key is its parent's and key's alone.
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_child_dedupe_reserved
    CHECK (dedupe_key IS NULL OR left(dedupe_key, 6) <> 'child/'
           OR (parent_id IS NOT NULL AND child_key IS NOT NULL
               AND dedupe_key = 'child/' || parent_id::text || '/' || child_key));

-- G9: the signals of a finished task the tasks purge may take (by its rules),
-- at most p_batch of them per call. Every signal has an event, so a task's
-- signals are only purged once its retained events are. Two statements, as
-- agentdb_purge_tasks: on Citus the tenant's must name it.
CREATE FUNCTION agentdb_purge_task_signals(p_tenant uuid, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    -- From the finished tasks (agent_tasks_finished_idx) to their signals
    -- (agent_signals_seq_key): the work before the LIMIT is bounded by them.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_signals s
        USING (SELECT g.tenant_id, g.id FROM agent_tasks k
               JOIN agent_signals g ON g.tenant_id = k.tenant_id AND g.task_id = k.id
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
               LIMIT p_batch) v
        WHERE s.tenant_id = v.tenant_id AND s.id = v.id;
    ELSE
        WITH v AS MATERIALIZED (
            SELECT g.id FROM agent_tasks k
            JOIN agent_signals g ON g.tenant_id = p_tenant AND g.task_id = k.id
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
            LIMIT p_batch)
        DELETE FROM agent_signals s USING v WHERE s.tenant_id = p_tenant AND s.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9, G17: 0021's tasks purge; a task with signals left is not picked (the
-- 'signals' class goes first), so no batch fails on one.
CREATE OR REPLACE FUNCTION agentdb_purge_tasks(p_tenant uuid, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    PERFORM agentdb_purge_books(p_tenant, 'tasks', p_batch, p_older_than);
    -- Two statements, not one with "p_tenant IS NULL OR": on Citus the tenant's
    -- must name it to route to its worker.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_tasks t
        USING (SELECT k.tenant_id, k.id FROM agent_tasks k
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_operations op
                                 WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                                 WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_signals s
                                 WHERE s.tenant_id = k.tenant_id AND s.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                                 WHERE c.tenant_id = k.tenant_id AND c.parent_id = k.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE t.tenant_id = v.tenant_id AND t.id = v.id;
    ELSE
        WITH v AS MATERIALIZED (
            SELECT k.id FROM agent_tasks k
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_operations op
                              WHERE op.tenant_id = p_tenant AND op.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                              WHERE ob.tenant_id = p_tenant AND ob.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_signals s
                              WHERE s.tenant_id = p_tenant AND s.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                              WHERE c.tenant_id = p_tenant AND c.parent_id = k.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9: retention class 'signals' (0021's routines kept as *_0021).
ALTER FUNCTION agentdb_purge(text, integer, interval) RENAME TO agentdb_purge_0021;
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(NULL, p_batch, p_older_than);
    END IF;
    RETURN agentdb_purge_0021(p_kind, p_batch, p_older_than);
END
$$;
ALTER FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant_0021;
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(p_tenant, p_batch, p_older_than);
    END IF;
    RETURN agentdb_purge_tenant_0021(p_tenant, p_kind, p_batch, p_older_than);
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge_task_signals(uuid, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tasks(uuid, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_0021(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant_0021(uuid, text, integer, interval) FROM PUBLIC;

-- Citus: a trigger on a distributed table reaches its shards only with this
-- setting (as agentdb_distribute() does for the others).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$$;

-- G22: fires before agent_signals_guard (triggers fire by name).
CREATE TRIGGER agent_signals_access
    BEFORE INSERT ON agent_signals
    FOR EACH ROW EXECUTE FUNCTION agentdb_signal_access();

-- 0021's distribution (kept as agentdb_distribute_0021). CREATE OR REPLACE
-- dropped the settings of the functions it replaced: they are set again.
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0021;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_distribute_0021(p_shard_count);
    CALL agentdb_distribute_wait_rules();
END
$$;
CREATE PROCEDURE agentdb_distribute_wait_rules()
    LANGUAGE plpgsql
AS $$
BEGIN
    ALTER FUNCTION agentdb_signal_access() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_signal() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_signal_cursor() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_child() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_fan_in() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_children_wait() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0021(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_wait_rules() FROM PUBLIC;

-- Applied to an install that is distributed already.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute_wait_rules();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0022.wait_rules'::text $$;

CALL agentdb_pin_search_paths();
