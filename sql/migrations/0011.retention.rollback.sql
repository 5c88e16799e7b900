-- Back to 0010: agent_events as one table again if it was partitioned
-- (agentdb_unpartition_events() copies every row back), no purge, no tenant
-- deletion.
CALL agentdb_unpartition_events();
DROP PROCEDURE agentdb_partition_events();
DROP PROCEDURE agentdb_unpartition_events();
DROP FUNCTION agentdb_event_partitions(integer);
DROP FUNCTION agentdb_event_records_once();
DROP FUNCTION agentdb_require_event_by_month();
DROP PROCEDURE agentdb_distribute_like(regclass, regclass);
DROP PROCEDURE agentdb_move_access(regclass, regclass, boolean);
DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
DROP FUNCTION agentdb_purge(text, integer, interval);
DROP FUNCTION agentdb_purge_tasks(uuid, integer, interval);
DROP FUNCTION agentdb_purge_task_signals(uuid, integer, interval);
DROP FUNCTION agentdb_purge_books(uuid, text, integer, interval);
