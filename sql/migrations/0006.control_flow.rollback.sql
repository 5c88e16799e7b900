-- Back to 0005: no signals, no fan-in, no guards of finished or late tasks.
-- What the signals were is still in their events; a child's row stays, as a
-- plain task.
-- A task waiting for a signal or for its children would sleep on with nothing
-- left to wake it (its wait is 'infinity'): it is woken at the end, with its
-- event, to run and decide again; one past its deadline is left to the
-- sweep, which ends it. Who they are is noted first; the wake-up comes after
-- the DROPs, which (on Citus, on every shard) refuse to run while its
-- deferred event check is pending.
CREATE TEMP TABLE agentdb_waking ON COMMIT DROP AS
    SELECT k.tenant_id, k.id FROM agent_tasks k
    WHERE k.state = 'waiting' AND (k.wait_signal IS NOT NULL OR k.wait_children IS NOT NULL)
      AND (k.deadline_at IS NULL OR k.deadline_at > now());
DROP TRIGGER agent_tasks_children_guard ON agent_tasks;
DROP TRIGGER agent_tasks_keep_parent ON agent_tasks;
DROP TRIGGER agent_tasks_fan_in ON agent_tasks;
DROP TRIGGER agent_tasks_child_guard ON agent_tasks;
DROP FUNCTION agentdb_keep_parent();
DROP FUNCTION agentdb_guard_children_wait();
DROP FUNCTION agentdb_fan_in();
DROP FUNCTION agentdb_children_done(uuid, uuid);
DROP FUNCTION agentdb_guard_child();
DROP TRIGGER agent_tasks_signal_guard ON agent_tasks;
DROP TABLE agent_signals;
DROP FUNCTION agentdb_guard_signal_cursor();
DROP FUNCTION agentdb_guard_signal_immutable();
DROP FUNCTION agentdb_deliver_signal();
DROP FUNCTION agentdb_guard_signal();
DROP FUNCTION agentdb_signal_access();
DROP FUNCTION agentdb_require_read_committed(text, text, text);
DROP INDEX agent_tasks_deadline_idx;
DROP TRIGGER agent_tasks_deadline_guard ON agent_tasks;
DROP FUNCTION agentdb_guard_deadline();
DROP TRIGGER agent_outbox_for_open_task ON agent_outbox;
DROP FUNCTION agentdb_guard_outbox_task();
DROP TRIGGER agent_operations_for_open_task_retry ON agent_operations;
DROP TRIGGER agent_operations_for_open_task ON agent_operations;
DROP FUNCTION agentdb_guard_open_task();

WITH woken AS (
    UPDATE agent_tasks k
    SET state = 'pending', state_version = k.state_version + 1, wake_at = now(),
        wait_signal = NULL, wait_children = NULL, updated_at = now()
    FROM agentdb_waking w
    WHERE k.tenant_id = w.tenant_id AND k.id = w.id AND k.state = 'waiting'
    RETURNING k.tenant_id, k.id, k.state_version, k.workflow_version, k.trace_id, k.span_id)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                          from_state, to_state, task_state_version, payload, trace_id, span_id)
SELECT w.tenant_id, w.id, 'task.woken', 'agentdb', w.workflow_version, 'waiting', 'pending',
       w.state_version, jsonb_build_object('rollback', '0006.control_flow'), w.trace_id, w.span_id
FROM woken w;
