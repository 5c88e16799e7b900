-- 0016 partial keys: the three unique keys of agent_tasks on columns most
-- tasks leave NULL take no index entry for those tasks (issue 41).
-- depends: 0015.time_ordered_ids
-- phase: expand
--
-- * agent_tasks_dedupe_key (G3), agent_tasks_child_key (G23) and
--   agent_tasks_schedule_tick_key (G24) were UNIQUE constraints, whose
--   indexes hold a row for every version of every task - NULL keys included,
--   though a NULL is never a duplicate. A task's claim and finish are not HOT
--   updates (its state is in the claim indexes' predicates), so each version
--   wrote an entry in each of the three: about 260 bytes of WAL per key per
--   unit of work whose task has none (a task is made, claimed, finished: three
--   versions). They are now unique indexes of the same names and columns,
--   WHERE their leading nullable column IS NOT NULL (dedupe_key; parent_id;
--   schedule_id, NULL exactly when schedule_tick is): what they refuse is
--   exactly what the constraints refused (two rows with equal keys, none of
--   them NULL), and a refusal still names them (23505, agent_tasks_*_key).
--   The predicate is the column a lookup names (a parent's children: WHERE
--   parent_id = $1, keyed or not; a schedule's tasks), so the planner can
--   still read those lookups from the index: an equality implies IS NOT NULL.
-- * ON CONFLICT infers a partial index only from its predicate: the runtime's
--   creates (agentdb/queries/tasks.sql, agentdb/_citus/queries/routed.sql)
--   name it, and agentdb_fire_schedule() is redefined whole with it.
-- * Each index is built before its constraint is dropped, in this one
--   transaction: no instant with neither. On a large agent_tasks the build
--   holds the table's SHARE lock (writes wait) for as long as it takes; the
--   rollback is the same in reverse.
-- * On Citus the DDL reaches every shard (distributed tables take CREATE
--   INDEX and DROP CONSTRAINT from the coordinator); the keys lead with the
--   tenant, as unique keys there must.

CREATE UNIQUE INDEX agent_tasks_dedupe_key_partial ON agent_tasks (tenant_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_dedupe_key;
ALTER INDEX agent_tasks_dedupe_key_partial RENAME TO agent_tasks_dedupe_key;

CREATE UNIQUE INDEX agent_tasks_child_key_partial ON agent_tasks (tenant_id, parent_id, child_key)
    WHERE parent_id IS NOT NULL;
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_child_key;
ALTER INDEX agent_tasks_child_key_partial RENAME TO agent_tasks_child_key;

CREATE UNIQUE INDEX agent_tasks_schedule_tick_key_partial
    ON agent_tasks (tenant_id, schedule_id, schedule_tick)
    WHERE schedule_id IS NOT NULL;
ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_schedule_tick_key;
ALTER INDEX agent_tasks_schedule_tick_key_partial RENAME TO agent_tasks_schedule_tick_key;

-- G24: fire schedule p_schedule of tenant p_tenant if it is due: its due
-- ticks' tasks (by its catch-up policy) with their events, next_tick_at
-- past them. Returns the tasks it created. A schedule another scheduler
-- holds is skipped (SKIP LOCKED); had it not been, the tick key would still
-- let only one task in. Redefined whole from 0007.schedules: its ON
-- CONFLICT names the tick key's predicate, which a partial unique index needs
-- to be inferred.
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
        ON CONFLICT (tenant_id, schedule_id, schedule_tick) WHERE schedule_id IS NOT NULL
        DO NOTHING
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

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0016.partial_keys'::text $$;

CALL agentdb_pin_search_paths();
