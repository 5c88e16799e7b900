-- Back to 0015: the three keys are UNIQUE constraints again (each built
-- before its partial index goes), and agentdb_fire_schedule() is 0007's.

-- Not ADD CONSTRAINT then RENAME CONSTRAINT: Citus refuses to rename a
-- distributed table's constraint (0A000). The whole index is built under a
-- temporary name, and the constraint takes it over under the old name.
CREATE UNIQUE INDEX agent_tasks_dedupe_key_full ON agent_tasks (tenant_id, dedupe_key);
DROP INDEX agent_tasks_dedupe_key;
ALTER INDEX agent_tasks_dedupe_key_full RENAME TO agent_tasks_dedupe_key;
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_dedupe_key UNIQUE USING INDEX agent_tasks_dedupe_key;

CREATE UNIQUE INDEX agent_tasks_child_key_full ON agent_tasks (tenant_id, parent_id, child_key);
DROP INDEX agent_tasks_child_key;
ALTER INDEX agent_tasks_child_key_full RENAME TO agent_tasks_child_key;
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_child_key UNIQUE USING INDEX agent_tasks_child_key;

CREATE UNIQUE INDEX agent_tasks_schedule_tick_key_full
    ON agent_tasks (tenant_id, schedule_id, schedule_tick);
DROP INDEX agent_tasks_schedule_tick_key;
ALTER INDEX agent_tasks_schedule_tick_key_full RENAME TO agent_tasks_schedule_tick_key;
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_schedule_tick_key
    UNIQUE USING INDEX agent_tasks_schedule_tick_key;

-- G24: fire schedule p_schedule of tenant p_tenant if it is due: its due
-- ticks' tasks (by its catch-up policy) with their events, next_tick_at
-- past them. Returns the tasks it created. A schedule another scheduler
-- holds is skipped (SKIP LOCKED); had it not been, the tick key would still
-- let only one task in.
CREATE OR REPLACE FUNCTION agentdb_fire_schedule(p_tenant uuid, p_schedule uuid)
    RETURNS TABLE (fired_task uuid, fired_tick timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    s record;
    due timestamptz[] := '{}';
    t timestamptz;
    made uuid;
BEGIN
    SELECT * INTO s FROM agent_schedules k
    WHERE k.tenant_id = p_tenant AND k.id = p_schedule
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR s.paused OR s.next_tick_at > now() THEN
        RETURN;
    END IF;
    IF s.catch_up = 'latest' THEN
        due := ARRAY[agentdb_schedule_tick(s.every, s.cron, s.anchor, now(), false)];
    ELSE
        t := s.next_tick_at;
        WHILE t IS NOT NULL AND t <= now() AND cardinality(due) < 100 LOOP
            due := due || t;
            t := agentdb_schedule_tick(s.every, s.cron, s.anchor, t, true);
        END LOOP;
    END IF;
    FOREACH t IN ARRAY due LOOP
        made := NULL;
        INSERT INTO agent_tasks AS k (tenant_id, task_type, workflow_version, params, wake_at,
                                      deadline_at, schedule_id, schedule_tick)
        VALUES (p_tenant, s.task_type, s.workflow_version, s.params, now(),
                t + s.task_deadline, p_schedule, t)
        ON CONFLICT (tenant_id, schedule_id, schedule_tick) DO NOTHING
        RETURNING k.id INTO made;
        IF made IS NOT NULL THEN
            INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                      to_state, task_state_version, payload)
            VALUES (p_tenant, made, 'task.created', 'agentdb.scheduler', s.workflow_version,
                    'pending', 0,
                    jsonb_strip_nulls(jsonb_build_object(
                        'schedule', s.name, 'tick', t,
                        'skipped_from', CASE WHEN t > s.next_tick_at AND s.catch_up = 'latest'
                                             THEN s.next_tick_at END)));
            fired_task := made;
            fired_tick := t;
            RETURN NEXT;
        END IF;
    END LOOP;
    -- A plain variable, not due[...]: Citus 13.2 crashes on an array subscript in a
    -- distributed UPDATE's parameters.
    t := due[cardinality(due)];
    UPDATE agent_schedules k
    SET next_tick_at = agentdb_schedule_tick(s.every, s.cron, s.anchor, t, true),
        last_tick_at = t, updated_at = now()
    WHERE k.tenant_id = p_tenant AND k.id = p_schedule;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0015.time_ordered_ids'::text $$;

CALL agentdb_pin_search_paths();
