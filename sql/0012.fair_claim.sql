-- 0012 fair claim: tenants share the workers, and a tenant may be capped (G18).
-- depends: 0011.key_binding
-- phase: expand
--
-- Until now the claim took due tasks in wake_at order across all tenants, so
-- a tenant with a large backlog delayed every other tenant's first task by
-- the whole backlog. The claim (agentdb/queries/leases.sql, lease_claim) now
-- walks the tenants that have due work round-robin and gives each its share
-- of the batch; the due index leads with (tenant_id, task_type) so that walk
-- and each tenant's pick are index probes, whatever the backlog.
--
-- A tenant - or one task type of a tenant - may be capped: at most
-- max_running of its tasks run at once. The claim respects the caps, and a
-- trigger refuses any write that would exceed one (AG009), so hand-typed
-- SQL cannot either. The trigger counts running tasks instead of keeping a
-- counter: a count cannot drift, and finishing a task needs no extra write.
--
-- Creating the index takes a lock that blocks writes to agent_tasks while it
-- builds (seconds per million due tasks); run it when that is acceptable.

-- G18: per-tenant (task_type '*') and per-task-type caps on running tasks.
-- max_running NULL means unlimited; 0 pauses the tenant (or the type).
-- A cap is configuration, not history: the deletion policy (G17) deletes it.
CREATE TABLE agent_concurrency_limits (
    tenant_id   uuid        NOT NULL,
    task_type   text        NOT NULL DEFAULT '*',
    max_running integer,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_concurrency_limits_pkey PRIMARY KEY (tenant_id, task_type),
    -- G2: a cap names a tenant; RESTRICT, deletion follows G17's routine.
    CONSTRAINT agent_concurrency_limits_tenant_fkey FOREIGN KEY (tenant_id)
        REFERENCES agent_tenants (id),
    -- G18
    CONSTRAINT agent_concurrency_limits_max_running_valid CHECK (max_running >= 0),
    CONSTRAINT agent_concurrency_limits_task_type_valid CHECK (length(task_type) BETWEEN 1 AND 200)
);

ALTER TABLE agent_concurrency_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_concurrency_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_concurrency_limits_owner_all ON agent_concurrency_limits
    TO CURRENT_USER USING (true) WITH CHECK (true);

-- G18: tenant-leading, so the claim's walk over the tenants and their task
-- types, and its pick inside one of them, are index probes however long
-- the backlog (and Citus can route them by tenant).
DROP INDEX agent_tasks_due_idx;
CREATE INDEX agent_tasks_due_idx ON agent_tasks (tenant_id, task_type, wake_at)
    WHERE state IN ('pending', 'waiting');
-- G18: what a cap counts; only running rows are in it.
CREATE INDEX agent_tasks_running_idx ON agent_tasks (tenant_id, task_type)
    WHERE state = 'running';

-- G18: how many of a tenant's tasks run now ('*': of every type). VOLATILE
-- on purpose: called from the claim it counts with a fresh snapshot, so it
-- sees tasks another claimer committed after the claim statement began.
CREATE FUNCTION agentdb_running_count(p_tenant uuid, p_task_type text) RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
    SELECT count(*) FROM agent_tasks t
    WHERE t.tenant_id = p_tenant AND t.state = 'running'
      AND (p_task_type = '*' OR t.task_type = p_task_type)
$$;

-- G18: refuse a move into 'running' that takes a tenant (or a task type of
-- it) over its cap. Locks the caps it checks, so two writers cannot both
-- take the last slot; the claim holds those locks already and never waits.
CREATE FUNCTION agentdb_guard_concurrency() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    cap record;
    running bigint;
BEGIN
    FOR cap IN
        SELECT l.task_type, l.max_running
        FROM agent_concurrency_limits l
        WHERE l.tenant_id = NEW.tenant_id AND l.task_type IN ('*', NEW.task_type)
          AND l.max_running IS NOT NULL
        ORDER BY l.task_type
        FOR UPDATE
    LOOP
        running := agentdb_running_count(NEW.tenant_id, cap.task_type);
        IF running > cap.max_running THEN
            RAISE EXCEPTION 'agentdb: tenant % would run % task(s) of type %, over its limit of %',
                    NEW.tenant_id, running, cap.task_type, cap.max_running
                USING ERRCODE = 'AG009', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- G18: every way into 'running' is an UPDATE (G6 has no edge from '(new)').
CREATE TRIGGER agent_tasks_concurrency_guard
    AFTER UPDATE OF state ON agent_tasks
    FOR EACH ROW WHEN (NEW.state = 'running' AND OLD.state <> 'running')
    EXECUTE FUNCTION agentdb_guard_concurrency();

-- The grants of 0007, with the caps table added. On Citus the agent-scope
-- policies are written without the (SELECT ...) wrapper: Citus refuses
-- sub-selects in policies of distributed tables; on plain Postgres the
-- wrapper only saves re-evaluating the function per row.
CREATE OR REPLACE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
DECLARE
    may_create boolean;
    saved_level text := current_setting('client_min_messages');
    scope text := '(SELECT agentdb_current_tenant())';
    tbl text;
BEGIN
    SELECT r.rolsuper OR r.rolcreaterole INTO may_create
    FROM pg_roles r WHERE r.rolname = current_user;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        scope := 'agentdb_current_tenant()';
    END IF;

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
        -- G18: the claim locks the caps it applies (FOR UPDATE needs UPDATE);
        -- no DELETE: max_running NULL lifts a cap.
        GRANT SELECT, INSERT, UPDATE ON agent_concurrency_limits TO agentdb_runtime;
        -- G8: the runtime appends to the audit log and never rewrites it.
        GRANT SELECT, INSERT ON agent_events, agent_inbox, agent_artifacts TO agentdb_runtime;
        GRANT USAGE ON SEQUENCE agent_events_id_seq TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_running_count(uuid, text) TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_runtime;

        FOREACH tbl IN ARRAY ARRAY['agent_tenants', 'agent_tasks', 'agent_operations', 'agent_events',
                                   'agent_outbox', 'agent_inbox', 'agent_artifacts',
                                   'agent_credential_refs', 'agent_concurrency_limits']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_runtime_all', tbl);
            EXECUTE format('CREATE POLICY %I ON %I TO agentdb_runtime USING (true) WITH CHECK (true)',
                           tbl || '_runtime_all', tbl);
        END LOOP;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        -- G15: read-only, own tenant only; writes go through agentdb_request_task.
        -- No access to the caps: they are the operator's, not the agent's.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_agent', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_tasks, agent_operations,
                        agent_events, agent_artifacts TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_agent;

        DROP POLICY IF EXISTS agent_tenants_agent_scope ON agent_tenants;
        EXECUTE format('CREATE POLICY agent_tenants_agent_scope ON agent_tenants FOR SELECT '
                       'TO agentdb_agent USING (id = %s)', scope);
        FOREACH tbl IN ARRAY ARRAY['agent_tasks', 'agent_operations', 'agent_events', 'agent_artifacts']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_agent_scope', tbl);
            EXECUTE format('CREATE POLICY %I ON %I FOR SELECT TO agentdb_agent USING (tenant_id = %s)',
                           tbl || '_agent_scope', tbl, scope);
        END LOOP;
    END IF;

    PERFORM set_config('client_min_messages', saved_level, true);
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_running_count(uuid, text) FROM PUBLIC;

-- G17: the tenant deletion policy of 0009 with one more step, the tenant's
-- concurrency limits (14; the tenant row is now 15). Steps 7 and 8 take each
-- row's retention from one grouped read of the tenant's events instead of a
-- LATERAL aggregate per row: the same result, and a form Citus can push
-- down to the tenant's shard.
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
            LEFT JOIN (
                SELECT e.task_id, max(e.retain_until) AS until FROM agent_events e
                WHERE e.tenant_id = p_tenant GROUP BY e.task_id) kept ON kept.task_id = u.id
            CROSS JOIN LATERAL (SELECT coalesce(kept.until, now()) AS until) keep
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
            LEFT JOIN (
                SELECT e.operation_id, max(e.retain_until) AS until FROM agent_events e
                WHERE e.tenant_id = p_tenant AND e.operation_id IS NOT NULL
                GROUP BY e.operation_id) kept ON kept.operation_id = u.id
            CROSS JOIN LATERAL (SELECT coalesce(kept.until, now()) AS until) keep
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

    -- 14. concurrency limits (G18): configuration, not history
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_concurrency_limits l WHERE l.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_concurrency_limits l WHERE l.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 14, 'agent_concurrency_limits', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 15. the tenant itself, once nothing of it is retained
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (SELECT 1 FROM agent_tasks k WHERE k.tenant_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 15, 'agent_tenants', 'delete', n, NULL::timestamptz, NULL::text[];
END
$$;


-- The newest migration this schema has; replaced by every later migration.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0012.fair_claim'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
