-- Back to nothing: the routines, then the tables.
DROP PROCEDURE agentdb_pin_search_paths();
DROP TABLE agent_semconv_pins;
DROP FUNCTION agentdb_refuse_change();
DROP FUNCTION agentdb_notify();
DROP FUNCTION agentdb_jsonb_has_secrets(jsonb);
DROP FUNCTION agentdb_is_secret_value(text);
DROP FUNCTION agentdb_is_secret_key(text);
DROP FUNCTION agentdb_guard_transition();
DROP FUNCTION agentdb_distributed();
DROP FUNCTION agentdb_scope_tenant(uuid);
DROP FUNCTION agentdb_current_tenant();
DROP TABLE agent_transitions;
DROP TABLE agent_principals;
DROP TABLE agent_tenants;
