-- 0010 access: row-level security and the two runtime roles (G15).
-- depends: 0009.budgets
-- phase: expand
--
-- Roles (cluster-wide, NOLOGIN; grant them to your login roles):
--   agentdb_runtime  workers, relay, application helpers. Cross-tenant (it
--                    claims due work from every tenant), no DDL, no DELETE,
--                    no UPDATE/DELETE/TRUNCATE on the audit log.
--   agentdb_agent    what an AI agent or tool connects as. SELECT on its own
--                    tenant's rows only; writes only through the approved
--                    function agentdb_request_task and plain signals to its
--                    own tenant's tasks; no outbox, inbox, credential,
--                    budget, cap or schedule access at all.
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
-- an explicit policy opens them. (agent_principals, agent_transitions and
-- agent_semconv_pins are lookups, not tenant data; agent_global_rate_limits
-- is every tenant's.)
ALTER TABLE agent_tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tenants FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_concurrency_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_concurrency_limits FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_operations FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_signals ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_signals FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_schedules FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_steps FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budgets FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_budget_holds ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budget_holds FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_rate_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_rate_limits FORCE ROW LEVEL SECURITY;

CREATE POLICY agent_tenants_owner_all ON agent_tenants TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_tasks_owner_all ON agent_tasks TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_concurrency_limits_owner_all ON agent_concurrency_limits
    TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_operations_owner_all ON agent_operations TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_artifacts_owner_all ON agent_artifacts TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_credential_refs_owner_all ON agent_credential_refs TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_events_owner_all ON agent_events TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_outbox_owner_all ON agent_outbox TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_inbox_owner_all ON agent_inbox TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_signals_owner_all ON agent_signals TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_schedules_owner_all ON agent_schedules TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_steps_owner_all ON agent_steps TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_budgets_owner_all ON agent_budgets TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_budget_holds_owner_all ON agent_budget_holds
    TO CURRENT_USER USING (true) WITH CHECK (true);
CREATE POLICY agent_rate_limits_owner_all ON agent_rate_limits TO CURRENT_USER USING (true) WITH CHECK (true);

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
-- Idempotent: run it again after a DBA has created missing roles (the
-- policies are dropped and made again). On Citus the agent-scope policies of
-- the tables agents read since the start are written without the
-- (SELECT ...) wrapper: Citus refuses sub-selects in policies of distributed
-- tables; on plain Postgres the wrapper only saves re-evaluating the
-- function per row. (The signals' and the steps' agent policies were first
-- written without it everywhere, and still are.)
CREATE PROCEDURE agentdb_grant_roles()
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
        -- G22: the runtime sends and reads signals (cross-tenant, as it claims).
        GRANT SELECT, INSERT ON agent_signals TO agentdb_runtime;
        -- G24: it creates, pauses and fires schedules, and deletes none.
        GRANT SELECT, INSERT, UPDATE ON agent_schedules TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_fire_schedule(uuid, uuid) TO agentdb_runtime;
        -- G25: it records and reads the steps of the tasks it holds.
        GRANT SELECT, INSERT, UPDATE ON agent_steps TO agentdb_runtime;
        -- G19: it holds and settles (UPDATE) and may set budgets and limits
        -- (INSERT, UPDATE); it never deletes them.
        GRANT SELECT, INSERT, UPDATE ON agent_budgets, agent_budget_holds, agent_rate_limits,
                                        agent_global_rate_limits TO agentdb_runtime;

        FOREACH tbl IN ARRAY ARRAY['agent_tenants', 'agent_tasks', 'agent_operations', 'agent_events',
                                   'agent_outbox', 'agent_inbox', 'agent_artifacts',
                                   'agent_credential_refs', 'agent_concurrency_limits',
                                   'agent_signals', 'agent_schedules', 'agent_steps',
                                   'agent_budgets', 'agent_budget_holds', 'agent_rate_limits']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_runtime_all', tbl);
            EXECUTE format('CREATE POLICY %I ON %I TO agentdb_runtime USING (true) WITH CHECK (true)',
                           tbl || '_runtime_all', tbl);
        END LOOP;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        -- G15: read-only, own tenant only; writes go through agentdb_request_task.
        -- No access to the caps, budgets or schedules: they are the operator's.
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

        -- G15, G22: an agent reads its own tenant's signals and sends plain
        -- signals to them - never an approval (an agent does not approve its
        -- own work).
        GRANT SELECT, INSERT ON agent_signals TO agentdb_agent;
        DROP POLICY IF EXISTS agent_signals_agent_scope ON agent_signals;
        CREATE POLICY agent_signals_agent_scope ON agent_signals FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
        DROP POLICY IF EXISTS agent_signals_agent_send ON agent_signals;
        CREATE POLICY agent_signals_agent_send ON agent_signals FOR INSERT TO agentdb_agent
            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');
        -- G15, G25: it reads its own tenant's steps and writes none (a step is
        -- written under a lease it never holds).
        GRANT SELECT ON agent_steps TO agentdb_agent;
        DROP POLICY IF EXISTS agent_steps_agent_scope ON agent_steps;
        CREATE POLICY agent_steps_agent_scope ON agent_steps FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
    END IF;

    PERFORM set_config('client_min_messages', saved_level, true);
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
