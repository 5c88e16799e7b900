-- Back to 0019: no signals; the routines of 0014 and 0018 under their own
-- names again. What the signals were is still in their events.
-- A task waiting for a signal would sleep on with nothing left to wake it
-- (its wait is 'infinity'): it is woken at the end, with its event, to run
-- and decide again; one past its deadline is left to the sweep, which ends
-- it. Who they are is noted first, while wait_signal says so; the wake-up comes
-- after the ALTER TABLEs, which (on Citus, on every shard) refuse to run
-- while its deferred event check is pending.
CREATE TEMP TABLE agentdb_waking ON COMMIT DROP AS
    SELECT k.tenant_id, k.id FROM agent_tasks k
    WHERE k.state = 'waiting' AND k.wait_signal IS NOT NULL
      AND (k.deadline_at IS NULL OR k.deadline_at > now());
DROP PROCEDURE agentdb_distribute(integer);
DROP PROCEDURE agentdb_distribute_signals();
ALTER PROCEDURE agentdb_distribute_0018(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0014(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0014(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_signals(uuid, text, interval);
DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
ALTER FUNCTION agentdb_delete_tenant_0014(uuid, boolean, text) RENAME TO agentdb_delete_tenant;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_signals FROM agentdb_runtime;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        REVOKE ALL ON agent_signals FROM agentdb_agent;
    END IF;
END
$$;
DROP PROCEDURE agentdb_grant_roles();
ALTER PROCEDURE agentdb_grant_roles_0014() RENAME TO agentdb_grant_roles;
DROP TRIGGER agent_tasks_signal_guard ON agent_tasks;
DROP TABLE agent_signals;
DROP FUNCTION agentdb_guard_signal();
DROP FUNCTION agentdb_deliver_signal();
DROP FUNCTION agentdb_guard_signal_immutable();
DROP FUNCTION agentdb_guard_signal_cursor();
ALTER TABLE agent_tasks DROP COLUMN wait_signal;
ALTER TABLE agent_tasks DROP COLUMN signal_cursor;

WITH woken AS (
    UPDATE agent_tasks k
    SET state = 'pending', state_version = k.state_version + 1, wake_at = now(), updated_at = now()
    FROM agentdb_waking w
    WHERE k.tenant_id = w.tenant_id AND k.id = w.id AND k.state = 'waiting'
    RETURNING k.tenant_id, k.id, k.state_version, k.workflow_version, k.trace_id, k.span_id)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                          from_state, to_state, task_state_version, payload, trace_id, span_id)
SELECT w.tenant_id, w.id, 'task.woken', 'agentdb', w.workflow_version, 'waiting', 'pending',
       w.state_version, jsonb_build_object('rollback', '0020.signals'), w.trace_id, w.span_id
FROM woken w;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0019.deadlines'::text $$;

CALL agentdb_pin_search_paths();
