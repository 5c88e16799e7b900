-- Back to 0020: no children. A child's row stays, as a plain task.
-- A task waiting for its children would sleep on with nothing left to wake it
-- (its wait is 'infinity'): it is woken at the end, with its event, to run
-- and decide again; one past its deadline is left to the sweep, which ends
-- it. Who they are is noted first, while wait_children says so; the wake-up comes
-- after the ALTER TABLEs, which (on Citus, on every shard) refuse to run
-- while its deferred event check is pending.
CREATE TEMP TABLE agentdb_waking ON COMMIT DROP AS
    SELECT k.tenant_id, k.id FROM agent_tasks k
    WHERE k.state = 'waiting' AND k.wait_children IS NOT NULL
      AND (k.deadline_at IS NULL OR k.deadline_at > now());
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_children();
ALTER PROCEDURE agentdb_distribute_0020(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0020(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0020(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_tasks(uuid, integer, interval);
DROP TRIGGER agent_tasks_child_guard ON agent_tasks;
DROP TRIGGER agent_tasks_fan_in ON agent_tasks;
DROP TRIGGER agent_tasks_children_guard ON agent_tasks;
DROP TRIGGER agent_tasks_keep_parent ON agent_tasks;
DROP FUNCTION agentdb_guard_child();
DROP FUNCTION agentdb_fan_in();
DROP FUNCTION agentdb_guard_children_wait();
DROP FUNCTION agentdb_keep_parent();
DROP FUNCTION agentdb_children_done(uuid, uuid);
ALTER TABLE agent_tasks DROP COLUMN wait_children;
ALTER TABLE agent_tasks DROP COLUMN child_key;
ALTER TABLE agent_tasks DROP COLUMN parent_id;

WITH woken AS (
    UPDATE agent_tasks k
    SET state = 'pending', state_version = k.state_version + 1, wake_at = now(), updated_at = now()
    FROM agentdb_waking w
    WHERE k.tenant_id = w.tenant_id AND k.id = w.id AND k.state = 'waiting'
    RETURNING k.tenant_id, k.id, k.state_version, k.workflow_version, k.trace_id, k.span_id)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                          from_state, to_state, task_state_version, payload, trace_id, span_id)
SELECT w.tenant_id, w.id, 'task.woken', 'agentdb', w.workflow_version, 'waiting', 'pending',
       w.state_version, jsonb_build_object('rollback', '0021.children'), w.trace_id, w.span_id
FROM woken w;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0020.signals'::text $$;

CALL agentdb_pin_search_paths();
