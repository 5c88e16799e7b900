DROP TRIGGER agent_operations_event_required ON agent_operations;
DROP TRIGGER agent_tasks_event_required ON agent_tasks;
DROP FUNCTION agentdb_require_event();
DROP TABLE agent_events;
DROP FUNCTION agentdb_guard_append_only();
DROP FUNCTION agentdb_jsonb_has_secrets(jsonb);
DROP FUNCTION agentdb_is_secret_value(text);
DROP FUNCTION agentdb_is_secret_key(text);
