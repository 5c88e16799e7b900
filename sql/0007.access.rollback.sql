-- Roles are cluster-wide and may serve other databases, so rollback revokes
-- what this schema granted and leaves the roles themselves in place.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_tenants, agent_transitions, agent_credential_refs, agent_tasks,
                      agent_operations, agent_outbox, agent_events, agent_inbox, agent_artifacts
            FROM agentdb_runtime;
        REVOKE ALL ON SEQUENCE agent_events_id_seq FROM agentdb_runtime;
        REVOKE ALL ON FUNCTION agentdb_current_tenant() FROM agentdb_runtime;
        EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM agentdb_runtime', current_schema());
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        REVOKE ALL ON agent_tenants, agent_transitions, agent_tasks, agent_operations,
                      agent_events, agent_artifacts
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
DROP POLICY IF EXISTS agent_operations_runtime_all ON agent_operations;
DROP POLICY IF EXISTS agent_events_runtime_all ON agent_events;
DROP POLICY IF EXISTS agent_outbox_runtime_all ON agent_outbox;
DROP POLICY IF EXISTS agent_inbox_runtime_all ON agent_inbox;
DROP POLICY IF EXISTS agent_artifacts_runtime_all ON agent_artifacts;
DROP POLICY IF EXISTS agent_credential_refs_runtime_all ON agent_credential_refs;
DROP POLICY IF EXISTS agent_tenants_agent_scope ON agent_tenants;
DROP POLICY IF EXISTS agent_tasks_agent_scope ON agent_tasks;
DROP POLICY IF EXISTS agent_operations_agent_scope ON agent_operations;
DROP POLICY IF EXISTS agent_events_agent_scope ON agent_events;
DROP POLICY IF EXISTS agent_artifacts_agent_scope ON agent_artifacts;
DROP POLICY agent_tenants_owner_all ON agent_tenants;
DROP POLICY agent_tasks_owner_all ON agent_tasks;
DROP POLICY agent_operations_owner_all ON agent_operations;
DROP POLICY agent_events_owner_all ON agent_events;
DROP POLICY agent_outbox_owner_all ON agent_outbox;
DROP POLICY agent_inbox_owner_all ON agent_inbox;
DROP POLICY agent_artifacts_owner_all ON agent_artifacts;
DROP POLICY agent_credential_refs_owner_all ON agent_credential_refs;
ALTER TABLE agent_tenants NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tenants DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_tasks DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_operations NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_operations DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_events NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_events DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_outbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_inbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_artifacts DISABLE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE agent_credential_refs DISABLE ROW LEVEL SECURITY;
