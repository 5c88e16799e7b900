-- Back to 0028: no steps, no guard on messages for cancelled tasks; the
-- routines 0029 redefined have their 0028 bodies again, whole.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_steps FROM agentdb_runtime;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        REVOKE ALL ON agent_steps FROM agentdb_agent;
    END IF;
END
$$;

CREATE OR REPLACE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_grant_roles_0020();
    PERFORM set_config('client_min_messages', 'warning', true);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        GRANT SELECT, INSERT, UPDATE ON agent_schedules TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_fire_schedule(uuid, uuid) TO agentdb_runtime;
        DROP POLICY IF EXISTS agent_schedules_runtime_all ON agent_schedules;
        CREATE POLICY agent_schedules_runtime_all ON agent_schedules
            TO agentdb_runtime USING (true) WITH CHECK (true);
    END IF;
    PERFORM set_config('client_min_messages', 'notice', true);
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

CREATE OR REPLACE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_schedules s WHERE s.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_schedules s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT * FROM agentdb_delete_tenant_0020(p_tenant, p_dry_run, p_actor);
    RETURN QUERY SELECT 20, 'agent_schedules', 'delete', n, NULL::timestamptz, NULL::text[];
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;

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

REVOKE EXECUTE ON FUNCTION agentdb_purge_tasks(uuid, integer, interval) FROM PUBLIC;

CREATE OR REPLACE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    paused text[] := '{}';
    name text;
    distributed boolean := true;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition p
                                WHERE p.logicalrelid = ''agent_events''::regclass)'
            INTO distributed;
    END IF;
    IF NOT distributed
       AND (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        FOR name IN
            SELECT t.tgname FROM pg_trigger t
            WHERE t.tgrelid = 'agent_events'::regclass AND NOT t.tgisinternal
              AND t.tgenabled <> 'D' AND t.tgtype & 5 = 5  -- row-level insert, as 0015
            ORDER BY t.tgname
        LOOP
            EXECUTE format('ALTER TABLE agent_events DISABLE TRIGGER %I', name);
            paused := paused || name;
        END LOOP;
    END IF;
    CALL agentdb_distribute_0027(p_shard_count);
    FOREACH name IN ARRAY paused LOOP
        EXECUTE format('ALTER TABLE agent_events ENABLE TRIGGER %I', name);
    END LOOP;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
DROP PROCEDURE agentdb_distribute_steps();

DROP TRIGGER agent_outbox_for_open_task ON agent_outbox;
DROP TABLE agent_steps;
DROP FUNCTION agentdb_guard_step();
DROP FUNCTION agentdb_guard_outbox_task();

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0028.events_by_month'::text $$;

CALL agentdb_pin_search_paths();
