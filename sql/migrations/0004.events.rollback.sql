-- Back to 0003: no audit trail (the sequence goes with its table).
DROP TRIGGER agent_operations_event_required ON agent_operations;
DROP TRIGGER agent_tasks_event_required ON agent_tasks;
DROP FUNCTION agentdb_require_event();
DROP TABLE agent_events;
DROP FUNCTION agentdb_guard_append_only();
