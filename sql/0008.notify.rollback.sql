DROP TRIGGER agent_tasks_notify ON agent_tasks;
DROP TRIGGER agent_outbox_notify ON agent_outbox;
DROP FUNCTION agentdb_notify();
