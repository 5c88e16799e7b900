-- Back to 0008: no budgets, holds or rate limits.
DROP TRIGGER agent_operations_rate_limit_retry ON agent_operations;
DROP TRIGGER agent_operations_rate_limit ON agent_operations;
DROP FUNCTION agentdb_count_call();
DROP FUNCTION agentdb_rate_step(interval, timestamptz, integer, timestamptz);
DROP TABLE agent_budget_holds;
DROP TABLE agent_budgets;
DROP TABLE agent_rate_limits;
DROP TABLE agent_global_rate_limits;
DROP FUNCTION agentdb_guard_budget_hold();
DROP FUNCTION agentdb_guard_budget();
