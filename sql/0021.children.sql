-- 0021 children: a task's children belong to its tenant, are created once
-- per key, and their parent is woken exactly once when enough have finished
-- (G23).
-- depends: 0020.signals
-- phase: expand
--
-- A child is a task with parent_id set: the composite foreign key keeps it
-- in its parent's tenant (G2), and (tenant_id, parent_id, child_key) is
-- unique, so a retried fan-out creates each child once. A finished parent
-- takes no new child (AG012, as 0018 refuses its operations).
--
-- The parent waits in 'waiting' with wait_children = N (all of its children,
-- or a quorum). Each child's finish (AFTER UPDATE trigger
-- agent_tasks_fan_in) locks the parent row FOR UPDATE and then counts the
-- finished children in a snapshot taken after the lock: children finishing
-- at once serialise on the parent, the last of them sees every sibling's
-- finish, and the wake - to 'pending', wait_children cleared, event
-- task.children_done - happens once, because the next finish finds the
-- parent no longer waiting. A wait that begins after the last child finished
-- is not lost either: the wait's own UPDATE (BEFORE trigger
-- agent_tasks_children_guard) counts the same way and makes the task due at
-- once, as 0020 does for a signal already there. A child's result is the
-- payload of its finishing event (agentdb.tasks.children reads it).

-- G23
ALTER TABLE agent_tasks ADD COLUMN parent_id uuid;
ALTER TABLE agent_tasks ADD COLUMN child_key text;
ALTER TABLE agent_tasks ADD COLUMN wait_children integer;
-- G2: a child is in its parent's tenant.
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_parent_fkey
    FOREIGN KEY (tenant_id, parent_id) REFERENCES agent_tasks (tenant_id, id);
-- G23: one child per key per parent; its index is also the lookup every
-- fan-in count and child listing makes (tenant_id, parent_id leading).
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_child_key UNIQUE (tenant_id, parent_id, child_key);
-- G5
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_child_key_valid
    CHECK (child_key IS NULL OR (length(child_key) BETWEEN 1 AND 200 AND parent_id IS NOT NULL));
-- G5
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_wait_children_valid
    CHECK (wait_children >= 1);

-- G23, G20: a finished parent takes no new child.
CREATE FUNCTION agentdb_guard_child() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    parent_state text;
BEGIN
    SELECT p.state INTO parent_state FROM agent_tasks p
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    FOR SHARE;
    IF parent_state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it takes no new child', NEW.parent_id, parent_state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G23: how many of a task's children have finished, counted now.
CREATE FUNCTION agentdb_children_done(p_tenant uuid, p_parent uuid) RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
    SELECT count(*) FROM agent_tasks c
    WHERE c.tenant_id = p_tenant AND c.parent_id = p_parent
      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead')
$$;

-- G23: a child finished - wake its parent if it was the one the parent waited for.
CREATE FUNCTION agentdb_fan_in() RETURNS trigger
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
    FOR UPDATE;
    -- A parent past its deadline is not woken (G21 would refuse it, and with it
    -- the child's finish): the sweep ends it.
    IF parent.state IS DISTINCT FROM 'waiting' OR parent.wait_children IS NULL
       OR parent.deadline_at <= now()
       OR agentdb_children_done(NEW.tenant_id, NEW.parent_id) < parent.wait_children THEN
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

-- G23: a wait for children that have finished already is due at once.
CREATE FUNCTION agentdb_guard_children_wait() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.wake_at > now() AND agentdb_children_done(NEW.tenant_id, NEW.id) >= NEW.wait_children THEN
        NEW.wake_at := now();
    END IF;
    RETURN NEW;
END
$$;

-- G9, G17: a parent stays while its children do. The purge (0010's rules,
-- kept as agentdb_purge_0020 / agentdb_purge_tenant_0020 for the other
-- classes) takes a finished task only once no child refers to it, so a batch
-- never picks a parent whose child it leaves behind; the books and signals
-- of what it may take go first, as before. The tenant deletion's "tasks with
-- no retained events" step deletes a parent and its children in one
-- statement; a parent whose child keeps its audit trail (or children of its
-- own) is kept with it (agent_tasks_keep_parent), for the next run.
CREATE FUNCTION agentdb_purge_tasks(p_tenant uuid, p_batch integer, p_older_than interval)
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
    PERFORM agentdb_purge_signals(p_tenant, 'tasks', p_older_than);
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
              AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                              WHERE c.tenant_id = p_tenant AND c.parent_id = k.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

ALTER FUNCTION agentdb_purge(text, integer, interval) RENAME TO agentdb_purge_0020;
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(NULL, p_batch, p_older_than);
    END IF;
    RETURN agentdb_purge_0020(p_kind, p_batch, p_older_than);
END
$$;
ALTER FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant_0020;
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(p_tenant, p_batch, p_older_than);
    END IF;
    RETURN agentdb_purge_tenant_0020(p_tenant, p_kind, p_batch, p_older_than);
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tasks(uuid, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_0020(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant_0020(uuid, text, integer, interval) FROM PUBLIC;

-- G17: see above. A row trigger that returns NULL keeps the row: the
-- deletion goes on without it.
CREATE FUNCTION agentdb_keep_parent() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_tasks c
               WHERE c.tenant_id = OLD.tenant_id AND c.parent_id = OLD.id
                 AND (EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = c.tenant_id AND e.task_id = c.id)
                      OR EXISTS (SELECT 1 FROM agent_tasks g
                                 WHERE g.tenant_id = c.tenant_id AND g.parent_id = c.id))) THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
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

-- G23, G20, G21 (0022 adds its deadline rule): only a child's insert calls it.
CREATE TRIGGER agent_tasks_child_guard
    BEFORE INSERT ON agent_tasks
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_child();
-- G23: only a child's finish calls it.
CREATE TRIGGER agent_tasks_fan_in
    AFTER UPDATE OF state ON agent_tasks
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL
                       AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                       AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled', 'dead'))
    EXECUTE FUNCTION agentdb_fan_in();
-- G17: a parent is not deleted from under its children.
CREATE TRIGGER agent_tasks_keep_parent
    BEFORE DELETE ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_keep_parent();
-- G23: only a wait for children calls it.
CREATE TRIGGER agent_tasks_children_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (NEW.state = 'waiting' AND NEW.wait_children IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_children_wait();

-- 0020's distribution (kept as agentdb_distribute_0020); the fan-in reads
-- and wakes the parent, always on the child's own shard (same tenant).
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0020;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_distribute_0020(p_shard_count);
    CALL agentdb_distribute_children();
END
$$;
CREATE PROCEDURE agentdb_distribute_children()
    LANGUAGE plpgsql
AS $$
BEGIN
    ALTER FUNCTION agentdb_guard_child() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_fan_in() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_children_wait() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_children_done(uuid, uuid) SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_keep_parent() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0020(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_children() FROM PUBLIC;

-- Applied to an install that is distributed already.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute_children();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0021.children'::text $$;

CALL agentdb_pin_search_paths();
