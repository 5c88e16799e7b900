-- Back to 0007: no step records (a handler re-entered then does its steps again).
DROP TABLE agent_steps;
DROP FUNCTION agentdb_guard_step();
