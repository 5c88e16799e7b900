-- Back to 0021: its signal guard, fan-in, child guard and purge again; no
-- 'signals' class, no reserved child keys, any isolation level.
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_wait_rules();
ALTER PROCEDURE agentdb_distribute_0021(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0021(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0021(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_task_signals(uuid, integer, interval);
DROP TRIGGER agent_signals_access ON agent_signals;
DROP FUNCTION agentdb_signal_access();
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_child_dedupe_reserved;

CREATE OR REPLACE FUNCTION agentdb_guard_signal() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task record;
BEGIN
    SELECT k.state, k.deadline_at, k.lease_owner INTO task FROM agent_tasks k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        NEW.seq := 1;  -- a placeholder for agent_signals_task_fkey to refuse (G2)
        RETURN NEW;
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
    IF NEW.kind = 'approval' AND NEW.sender = task.lease_owner THEN
        RAISE EXCEPTION 'agentdb: % holds task % and cannot approve its own work', NEW.sender, NEW.task_id
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    -- Read under the lock, in a snapshot taken after it: every signal that
    -- committed before this one is counted.
    NEW.seq := 1 + coalesce((SELECT max(s.seq) FROM agent_signals s
                             WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.task_id), 0);
    RETURN NEW;
END
$$;

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
    IF NEW.state = 'waiting' AND NEW.wait_signal IS NOT NULL AND NEW.wake_at > now()
       AND EXISTS (SELECT 1 FROM agent_signals s
                   WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal) THEN
        NEW.wake_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_guard_child() RETURNS trigger
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

CREATE OR REPLACE FUNCTION agentdb_guard_children_wait() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.wake_at > now() AND agentdb_children_done(NEW.tenant_id, NEW.id) >= NEW.wait_children THEN
        NEW.wake_at := now();
    END IF;
    RETURN NEW;
END
$$;

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

DROP FUNCTION agentdb_require_read_committed(text, text, text);

-- CREATE OR REPLACE dropped their Citus settings: set them again.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute_signals();
        CALL agentdb_distribute_children();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0021.children'::text $$;

CALL agentdb_pin_search_paths();
