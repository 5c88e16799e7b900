-- Back to 0009: no policies, no row-level security, nothing granted.
-- Roles are cluster-wide and may serve other databases, so the rollback
-- revokes what this schema granted and leaves the roles themselves in place.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_tenants, agent_transitions, agent_credential_refs, agent_tasks,
                      agent_operations, agent_outbox, agent_events, agent_inbox, agent_artifacts,
                      agent_concurrency_limits, agent_signals, agent_schedules, agent_steps,
                      agent_budgets, agent_budget_holds, agent_rate_limits, agent_global_rate_limits
            FROM agentdb_runtime;
        REVOKE ALL ON SEQUENCE agent_events_id_seq FROM agentdb_runtime;
        REVOKE ALL ON FUNCTION agentdb_current_tenant() FROM agentdb_runtime;
        REVOKE ALL ON FUNCTION agentdb_running_count(uuid, text) FROM agentdb_runtime;
        REVOKE ALL ON FUNCTION agentdb_fire_schedule(uuid, uuid) FROM agentdb_runtime;
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM agentdb_runtime', current_schema());
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        REVOKE ALL ON agent_tenants, agent_transitions, agent_tasks, agent_operations,
                      agent_events, agent_artifacts, agent_signals, agent_steps
            FROM agentdb_agent;
        REVOKE ALL ON FUNCTION agentdb_current_tenant() FROM agentdb_agent;
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM agentdb_agent', current_schema());
    END IF;
END
$$;
DROP PROCEDURE agentdb_grant_roles();
DROP FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text);
DROP POLICY IF EXISTS agent_tenants_runtime_all ON agent_tenants;
DROP POLICY IF EXISTS agent_tasks_runtime_all ON agent_tasks;
DROP POLICY IF EXISTS agent_concurrency_limits_runtime_all ON agent_concurrency_limits;
DROP POLICY IF EXISTS agent_operations_runtime_all ON agent_operations;
DROP POLICY IF EXISTS agent_artifacts_runtime_all ON agent_artifacts;
DROP POLICY IF EXISTS agent_credential_refs_runtime_all ON agent_credential_refs;
DROP POLICY IF EXISTS agent_events_runtime_all ON agent_events;
DROP POLICY IF EXISTS agent_outbox_runtime_all ON agent_outbox;
DROP POLICY IF EXISTS agent_inbox_runtime_all ON agent_inbox;
DROP POLICY IF EXISTS agent_signals_runtime_all ON agent_signals;
DROP POLICY IF EXISTS agent_schedules_runtime_all ON agent_schedules;
DROP POLICY IF EXISTS agent_steps_runtime_all ON agent_steps;
DROP POLICY IF EXISTS agent_budgets_runtime_all ON agent_budgets;
DROP POLICY IF EXISTS agent_budget_holds_runtime_all ON agent_budget_holds;
DROP POLICY IF EXISTS agent_rate_limits_runtime_all ON agent_rate_limits;
DROP POLICY IF EXISTS agent_tenants_agent_scope ON agent_tenants;
DROP POLICY IF EXISTS agent_tasks_agent_scope ON agent_tasks;
DROP POLICY IF EXISTS agent_operations_agent_scope ON agent_operations;
DROP POLICY IF EXISTS agent_events_agent_scope ON agent_events;
DROP POLICY IF EXISTS agent_artifacts_agent_scope ON agent_artifacts;
DROP POLICY IF EXISTS agent_signals_agent_scope ON agent_signals;
DROP POLICY IF EXISTS agent_signals_agent_send ON agent_signals;
DROP POLICY IF EXISTS agent_steps_agent_scope ON agent_steps;
DROP POLICY agent_tenants_owner_all ON agent_tenants;
DROP POLICY agent_tasks_owner_all ON agent_tasks;
DROP POLICY agent_concurrency_limits_owner_all ON agent_concurrency_limits;
DROP POLICY agent_operations_owner_all ON agent_operations;
DROP POLICY agent_artifacts_owner_all ON agent_artifacts;
DROP POLICY agent_credential_refs_owner_all ON agent_credential_refs;
DROP POLICY agent_events_owner_all ON agent_events;
DROP POLICY agent_outbox_owner_all ON agent_outbox;
DROP POLICY agent_inbox_owner_all ON agent_inbox;
DROP POLICY agent_signals_owner_all ON agent_signals;
DROP POLICY agent_schedules_owner_all ON agent_schedules;
DROP POLICY agent_steps_owner_all ON agent_steps;
DROP POLICY agent_budgets_owner_all ON agent_budgets;
DROP POLICY agent_budget_holds_owner_all ON agent_budget_holds;
DROP POLICY agent_rate_limits_owner_all ON agent_rate_limits;
ALTER TABLE agent_tenants NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tenants DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_concurrency_limits NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_concurrency_limits DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_operations NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_operations DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_events NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_events DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_signals NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_signals DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_schedules NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_schedules DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_steps NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_steps DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budgets NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_budgets DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budget_holds NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_budget_holds DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_rate_limits NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_rate_limits DISABLE ROW LEVEL SECURITY;
