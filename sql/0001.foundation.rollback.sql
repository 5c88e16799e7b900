DROP PROCEDURE agentdb_pin_search_paths();
DROP FUNCTION agentdb_guard_version();
DROP FUNCTION agentdb_guard_transition();
DROP FUNCTION agentdb_current_tenant();
DROP TABLE agent_transitions;
DROP TABLE agent_principals;
DROP TABLE agent_tenants;
