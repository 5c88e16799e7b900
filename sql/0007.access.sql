-- 0007 access: row-level security and the two runtime roles (G15).
-- depends: 0006.artifacts
-- phase: expand
--
-- Roles (cluster-wide, NOLOGIN; grant them to your login roles):
--   agentdb_runtime  workers, relay, application helpers. Cross-tenant (it
--                    claims due work from every tenant), no DDL, no DELETE,
--                    no UPDATE/DELETE/TRUNCATE on the audit log.
--   agentdb_agent    what an AI agent or tool connects as. SELECT on its own
--                    tenant's rows only; writes only through the approved
--                    function agentdb_request_task; no outbox, inbox or
--                    credential access at all.
-- The owner (the role running this migration) keeps full access through an
-- owner policy; it is the admin connection agents must never get.
--
-- Without CREATEROLE: this migration still succeeds. agentdb_grant_roles()
-- creates the roles when it may, and otherwise grants to whichever of them
-- already exist and says with a NOTICE what is missing. Have a DBA run
--   CREATE ROLE agentdb_runtime NOLOGIN; CREATE ROLE agentdb_agent NOLOGIN;
-- (agentdb sql --roles prints this) and then, as the owner,
--   CALL agentdb_grant_roles();   -- or: agentdb grant

-- G15: tenant-owned tables enforce RLS even for their owner, so nothing but
-- an explicit policy opens them.
ALTER TABLE agent_tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tenants FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_operations FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs FORCE ROW LEVEL SECURITY;

CREATE POLICY agent_tenants_owner_all ON agent_tenants TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_tasks_owner_all ON agent_tasks TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_operations_owner_all ON agent_operations TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_events_owner_all ON agent_events TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_outbox_owner_all ON agent_outbox TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_inbox_owner_all ON agent_inbox TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_artifacts_owner_all ON agent_artifacts TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_credential_refs_owner_all ON agent_credential_refs TO CURRENT_USER USING (true) WITH CHECK (true);

-- G15: the one write an agent may make: ask for a task in its own tenant.
-- The tenant comes from agentdb_current_tenant(), never from an argument, and
-- the creation event (G8) is written with the caller's login role as actor.
CREATE FUNCTION agentdb_request_task(
    p_task_type        text,
    p_workflow_version text,
    p_params           jsonb DEFAULT '{}',
    p_dedupe_key       text  DEFAULT NULL,
    p_input_hash       text  DEFAULT NULL,
    p_trace_id         text  DEFAULT NULL,
    p_span_id          text  DEFAULT NULL
) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    scope  uuid := agentdb_current_tenant();
    new_id uuid;
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'agentdb: this session is not scoped to a tenant'
            USING ERRCODE = 'AG007', CONSTRAINT = 'agentdb_tenant_scope';
    END IF;
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, params,
                             dedupe_key, input_hash, trace_id, span_id)
    VALUES (scope, p_task_type, p_workflow_version, p_params,
            p_dedupe_key, p_input_hash, p_trace_id, p_span_id)
    RETURNING id INTO new_id;
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              to_state, task_state_version, trace_id, span_id)
    VALUES (scope, new_id, 'task.requested', session_user, p_workflow_version,
            'pending', 0, p_trace_id, p_span_id);
    RETURN new_id;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) FROM PUBLIC;

-- Creates the roles if this session may, then grants to whichever exist.
-- Idempotent: run it again after a DBA has created missing roles.
CREATE PROCEDURE agentdb_grant_roles()
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

REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
