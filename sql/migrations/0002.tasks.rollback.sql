-- Back to 0001: no tasks, no caps.
DROP TABLE agent_concurrency_limits;
DROP TABLE agent_tasks;
DROP FUNCTION agentdb_guard_concurrency();
DROP FUNCTION agentdb_running_count(uuid, text);
DROP FUNCTION agentdb_guard_version();
