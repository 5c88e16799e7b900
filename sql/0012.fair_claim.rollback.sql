-- Back to 0011: the global claim index, no caps, the grants of 0007.
DROP TRIGGER agent_tasks_concurrency_guard ON agent_tasks;
DROP FUNCTION agentdb_guard_concurrency();
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON FUNCTION agentdb_running_count(uuid, text) FROM agentdb_runtime;
    END IF;
END
$$;
DROP FUNCTION agentdb_running_count(uuid, text);

CREATE OR REPLACE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
    anonymised bigint := 0;  -- events steps 7 and 8 write (or would write)
    r text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;

    -- 1. tenants: mark deleting
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t WHERE t.id = p_tenant AND t.state <> 'deleting';
    ELSE
        UPDATE agent_tenants t SET state = 'deleting', updated_at = now()
        WHERE t.id = p_tenant AND t.state <> 'deleting';
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 1, 'agent_tenants', 'mark deleting', n, NULL::timestamptz, NULL::text[];

    -- 2. principals
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_principals p WHERE p.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_principals p WHERE p.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 2, 'agent_principals', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 3. credential references
    SELECT coalesce(array_agg(c.secret_ref ORDER BY c.secret_ref), '{}') INTO r
    FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 3, 'agent_credential_refs', 'delete (revoke refs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 4. artifacts
    SELECT coalesce(array_agg(a.uri ORDER BY a.uri), '{}') INTO r
    FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 4, 'agent_artifacts', 'delete (purge blobs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 5. inbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_inbox i WHERE i.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_inbox i WHERE i.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 5, 'agent_inbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 6. outbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_outbox o WHERE o.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_outbox o WHERE o.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 6, 'agent_outbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 7. tasks: cancel and anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant
          AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
               OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                      AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_tasks t
            SET state = CASE WHEN t.state IN ('pending', 'waiting', 'running') THEN 'cancelled'
                             ELSE t.state END,
                state_version = t.state_version + 1,
                params = '{}', last_error = NULL, current_step = NULL,
                lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                updated_at = now()
            WHERE t.tenant_id = p_tenant
              AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
                   OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                          AND e.task_id = t.id AND e.retain_until > now())
            RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                      to_state, task_state_version, payload, payload_expires_at,
                                      retain_until)
            SELECT u.tenant_id, u.id, 'task.anonymised', p_actor, u.workflow_version, u.state,
                   u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            CROSS JOIN LATERAL (
                SELECT coalesce(max(e.retain_until), now()) AS until FROM agent_events e
                WHERE e.tenant_id = u.tenant_id AND e.task_id = u.id) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 7, 'agent_tasks', 'cancel and anonymise', n, NULL::timestamptz, NULL::text[];

    -- 8. operations: anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                      AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_operations o
            SET result = NULL, error = NULL, state_version = o.state_version + 1, updated_at = now()
            WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                          AND e.operation_id = o.id AND e.retain_until > now())
            RETURNING o.tenant_id, o.id, o.task_id, o.state, o.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                                      policy_version, to_state, operation_state_version, payload,
                                      payload_expires_at, retain_until)
            SELECT u.tenant_id, u.task_id, u.id, 'operation.anonymised', p_actor, 'tenant-deletion',
                   u.state, u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            CROSS JOIN LATERAL (
                SELECT coalesce(max(e.retain_until), now()) AS until FROM agent_events e
                WHERE e.tenant_id = u.tenant_id AND e.operation_id = u.id) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 8, 'agent_operations', 'anonymise', n, NULL::timestamptz, NULL::text[];

    -- 9. events: erase payloads now (the one UPDATE the append-only guard allows)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
    ELSE
        UPDATE agent_events e SET payload = NULL
        WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 9, 'agent_events', 'erase payloads', n, NULL::timestamptz, NULL::text[];

    -- 10. events past their retention
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
    ELSE
        DELETE FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 10, 'agent_events', 'delete (retention passed)', n, NULL::timestamptz, NULL::text[];

    -- 11. events still under retention: kept for audit (a dry run adds the
    -- anonymisation events a real run would have written by now)
    SELECT count(*), max(e.retain_until) INTO n, retained_until
    FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until > now();
    IF p_dry_run THEN
        n := n + anonymised;
    END IF;
    RETURN QUERY SELECT 11, 'agent_events', 'retain for audit', n, retained_until, NULL::text[];

    -- 12. operations no retained event refers to
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
              AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id AND e.operation_id = o.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 12, 'agent_operations', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 13. tasks no retained event refers to (their operations, outbox rows and
    -- artifacts are gone by now)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
              AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 13, 'agent_tasks', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 14. the tenant itself, once nothing of it is retained
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (SELECT 1 FROM agent_tasks k WHERE k.tenant_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 14, 'agent_tenants', 'delete', n, NULL::timestamptz, NULL::text[];
END
$$;

DROP TABLE agent_concurrency_limits;

DROP INDEX agent_tasks_running_idx;
DROP INDEX agent_tasks_due_idx;
CREATE INDEX agent_tasks_due_idx ON agent_tasks (wake_at)
    WHERE state IN ('pending', 'waiting');

-- Creates the roles if this session may, then grants to whichever exist.
-- Idempotent: run it again after a DBA has created missing roles.
CREATE OR REPLACE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
DECLARE
    may_create boolean;
    saved_level text := current_setting('client_min_messages');
BEGIN
    SELECT r.rolsuper OR r.rolcreaterole INTO may_create
    FROM pg_roles r WHERE r.rolname = current_user;

    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        IF may_create THEN
            CREATE ROLE agentdb_runtime NOLOGIN;
        ELSE
            RAISE NOTICE 'agentdb: role agentdb_runtime is missing and % may not create roles; '
                'have a DBA run CREATE ROLE agentdb_runtime NOLOGIN, then CALL agentdb_grant_roles()', current_user;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        IF may_create THEN
            CREATE ROLE agentdb_agent NOLOGIN;
        ELSE
            RAISE NOTICE 'agentdb: role agentdb_agent is missing and % may not create roles; '
                'have a DBA run CREATE ROLE agentdb_agent NOLOGIN, then CALL agentdb_grant_roles()', current_user;
        END IF;
    END IF;

    -- Re-running drops and recreates the policies; their "does not exist"
    -- notices on the first run are noise.
    PERFORM set_config('client_min_messages', 'warning', true);

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        -- The schema's name is only known now; %I quotes it.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_runtime', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_credential_refs TO agentdb_runtime;
        GRANT SELECT, INSERT, UPDATE ON agent_tasks, agent_operations, agent_outbox TO agentdb_runtime;
        -- G8: the runtime appends to the audit log and never rewrites it.
        GRANT SELECT, INSERT ON agent_events, agent_inbox, agent_artifacts TO agentdb_runtime;
        GRANT USAGE ON SEQUENCE agent_events_id_seq TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_runtime;

        DROP POLICY IF EXISTS agent_tenants_runtime_all ON agent_tenants;
        CREATE POLICY agent_tenants_runtime_all ON agent_tenants TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_tasks_runtime_all ON agent_tasks;
        CREATE POLICY agent_tasks_runtime_all ON agent_tasks TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_operations_runtime_all ON agent_operations;
        CREATE POLICY agent_operations_runtime_all ON agent_operations TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_events_runtime_all ON agent_events;
        CREATE POLICY agent_events_runtime_all ON agent_events TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_outbox_runtime_all ON agent_outbox;
        CREATE POLICY agent_outbox_runtime_all ON agent_outbox TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_inbox_runtime_all ON agent_inbox;
        CREATE POLICY agent_inbox_runtime_all ON agent_inbox TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_artifacts_runtime_all ON agent_artifacts;
        CREATE POLICY agent_artifacts_runtime_all ON agent_artifacts TO agentdb_runtime USING (true) WITH CHECK (true);
        DROP POLICY IF EXISTS agent_credential_refs_runtime_all ON agent_credential_refs;
        CREATE POLICY agent_credential_refs_runtime_all ON agent_credential_refs TO agentdb_runtime USING (true) WITH CHECK (true);
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        -- G15: read-only, own tenant only; writes go through agentdb_request_task.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_agent', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_tasks, agent_operations,
                        agent_events, agent_artifacts TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_agent;

        DROP POLICY IF EXISTS agent_tenants_agent_scope ON agent_tenants;
        CREATE POLICY agent_tenants_agent_scope ON agent_tenants FOR SELECT TO agentdb_agent
            USING (id = (SELECT agentdb_current_tenant()));
        DROP POLICY IF EXISTS agent_tasks_agent_scope ON agent_tasks;
        CREATE POLICY agent_tasks_agent_scope ON agent_tasks FOR SELECT TO agentdb_agent
            USING (tenant_id = (SELECT agentdb_current_tenant()));
        DROP POLICY IF EXISTS agent_operations_agent_scope ON agent_operations;
        CREATE POLICY agent_operations_agent_scope ON agent_operations FOR SELECT TO agentdb_agent
            USING (tenant_id = (SELECT agentdb_current_tenant()));
        DROP POLICY IF EXISTS agent_events_agent_scope ON agent_events;
        CREATE POLICY agent_events_agent_scope ON agent_events FOR SELECT TO agentdb_agent
            USING (tenant_id = (SELECT agentdb_current_tenant()));
        DROP POLICY IF EXISTS agent_artifacts_agent_scope ON agent_artifacts;
        CREATE POLICY agent_artifacts_agent_scope ON agent_artifacts FOR SELECT TO agentdb_agent
            USING (tenant_id = (SELECT agentdb_current_tenant()));
    END IF;

    PERFORM set_config('client_min_messages', saved_level, true);
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0011.key_binding'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
