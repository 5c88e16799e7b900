DROP TABLE agent_semconv_pins;
DROP FUNCTION agentdb_refuse_change();
DROP INDEX agent_outbox_dead_idx;
DROP INDEX agent_tasks_finished_idx;
DROP INDEX agent_events_operation_idx;
DROP INDEX agent_operations_settled_idx;
DROP FUNCTION agentdb_purge(text, integer, interval);
