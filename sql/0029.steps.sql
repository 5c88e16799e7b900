-- 0029 steps: a durable handler's steps, recorded once per task and name
-- under the lease that ran them (G25); and no message for a cancelled task
-- (G20).
-- depends: 0028.events_by_month
-- phase: expand
--
-- A handler is re-entered from the top after every wait and every crash.
-- agentdb.worker.Job's straight-line API (job.step, job.effect,
-- job.wait_for_signal, job.sleep, job.run_children) makes that safe by
-- recording what each named step did, so a re-entry returns the recorded
-- answer instead of doing the work again. Effects are operations (their key,
-- input hash and reservation are G3, G4, G13's); everything else a handler
-- records is a row of agent_steps:
--
--   * 'step'     - a computation or a model request: its JSON result;
--   * 'signal'   - a durable wait for a signal: the signal it took (its seq),
--                  or that it timed out; while it waits, when it times out;
--   * 'sleep'    - a durable sleep: the instant it ends;
--   * 'children' - a fan-out: once enough children finished, their results.
--
-- The rules, for every writer (raw SQL included):
--
--   * one row per (task, name): agent_steps_pkey. A re-entry that reaches
--     the name finds it; a second recording of it is refused. The step's
--     input_hash (the canonical hash of its arguments, G4) never changes:
--     the same name with other arguments is a conflict the runtime names,
--     never a replay of the other call's result.
--   * written only under the task's current lease: agent_steps_guard locks
--     the task row (FOR SHARE, so a cancel, a take-over or the deadline
--     sweep and a step serialise) and refuses a step whose lease_token is
--     not the task's, for a task that is not running (AG018), that has
--     finished (AG012) or passed its deadline (AG013). A worker whose lease
--     expired and was taken over records nothing (G12).
--   * a recorded step never changes, but a wait that is 'waiting' is
--     finished once - 'waiting' -> 'done', with the signal it took or its
--     result - and nothing else of it moves (AG018).
--   * a signal is taken by one step at most (agent_steps_signal_key), and
--     only a signal of the step's own task (the guard reads it under the
--     task lock): an approval is read once, whatever the signal cursor says.
--   * a result is bounded (64 KiB, as an operation's) and carries no secret
--     (G9: the runtime masks them before writing).
--
-- Steps are not audit events: the row is the record, appended once, and the
-- task's own waits and finishes write their events as before.
--
-- G20: a message enqueued for a cancelled task is refused too (AG012), by
-- agent_outbox_for_open_task - the runtime's fenced writes could not see a
-- message a caller's own transaction writes with the task's id.

CREATE TABLE agent_steps (
    tenant_id   uuid        NOT NULL,
    task_id     uuid        NOT NULL,
    name        text        NOT NULL,
    kind        text        NOT NULL,
    state       text        NOT NULL DEFAULT 'done',
    -- G4: sha256 (hex) of the canonical encoding of the step's arguments.
    input_hash  text        NOT NULL,
    result      jsonb,
    -- G25: the signal a 'signal' step took.
    signal_seq  bigint,
    -- When a sleep ends, or a wait for a signal times out (the database's clock).
    wake_at     timestamptz,
    -- G12: the lease under which the row was last written.
    lease_token bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- G25: one record per task and step name.
    CONSTRAINT agent_steps_pkey PRIMARY KEY (tenant_id, task_id, name),
    -- G2: a step belongs to a task of its own tenant.
    CONSTRAINT agent_steps_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    -- G25: a signal is taken by one step at most.
    CONSTRAINT agent_steps_signal_key UNIQUE (tenant_id, task_id, signal_seq),
    -- G5
    CONSTRAINT agent_steps_name_valid CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT agent_steps_kind_valid CHECK (kind IN ('step', 'signal', 'sleep', 'children')),
    CONSTRAINT agent_steps_state_valid CHECK (state IN ('waiting', 'done')),
    CONSTRAINT agent_steps_lease_token_valid CHECK (lease_token >= 1),
    -- G4
    CONSTRAINT agent_steps_input_hash_format CHECK (input_hash ~ '^[0-9a-f]{64}$'),
    -- G25: only a wait waits; only a wait for a signal takes one; a sleep knows its end.
    CONSTRAINT agent_steps_waits_valid CHECK (
        (state = 'done' OR kind IN ('signal', 'sleep', 'children'))
        AND (signal_seq IS NULL OR (kind = 'signal' AND state = 'done'))
        AND (wake_at IS NULL OR kind IN ('signal', 'sleep'))
        AND (kind <> 'sleep' OR wake_at IS NOT NULL)),
    -- G9: a bounded fragment, like an operation's result; never a secret.
    CONSTRAINT agent_steps_result_valid CHECK (octet_length(result::text) <= 65536),
    CONSTRAINT agent_steps_result_no_secrets CHECK (NOT agentdb_jsonb_has_secrets(result))
);

-- G25: a step is written under the task's current lease, for a task that is
-- still running and within its deadline; a recorded step never changes, and a
-- wait is finished once. SECURITY DEFINER: it locks the task row, which the
-- writer (the runtime role) may read but the lock needs the owner's right to.
CREATE FUNCTION agentdb_guard_step() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task record;
BEGIN
    IF TG_OP = 'UPDATE' AND (
           OLD.state <> 'waiting' OR NEW.state <> 'done'
           OR NEW.tenant_id <> OLD.tenant_id OR NEW.task_id <> OLD.task_id
           OR NEW.name <> OLD.name OR NEW.kind <> OLD.kind
           OR NEW.input_hash <> OLD.input_hash OR NEW.created_at <> OLD.created_at
           OR NEW.wake_at IS DISTINCT FROM OLD.wake_at) THEN
        RAISE EXCEPTION 'agentdb: step % of task % is recorded; only a waiting step is finished, once',
                OLD.name, OLD.task_id
            USING ERRCODE = 'AG018', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    SELECT k.state, k.lease_token, k.deadline_at INTO task FROM agent_tasks k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN NEW;  -- agent_steps_task_fkey refuses it (G2)
    END IF;
    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it records no more steps', NEW.task_id, task.state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task.deadline_at <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it records no more steps',
                NEW.task_id, task.deadline_at
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task.state <> 'running' OR task.lease_token <> NEW.lease_token THEN
        RAISE EXCEPTION 'agentdb: step % of task % is not written under its current lease (token %, the task''s %)',
                NEW.name, NEW.task_id, NEW.lease_token, task.lease_token
            USING ERRCODE = 'AG018', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.signal_seq IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM agent_signals g
           WHERE g.tenant_id = NEW.tenant_id AND g.task_id = NEW.task_id AND g.seq = NEW.signal_seq) THEN
        RAISE EXCEPTION 'agentdb: task % has no signal % for step % to take',
                NEW.task_id, NEW.signal_seq, NEW.name
            USING ERRCODE = 'AG018', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G20: no message names a cancelled task, whoever writes it. AFTER, as the
-- operations' guard (0018): a replayed insert (ON CONFLICT DO NOTHING) wrote
-- nothing to refuse. Locks the task row FOR SHARE, so a cancel and the
-- message serialise and whichever commits second sees the other.
CREATE FUNCTION agentdb_guard_outbox_task() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task_state text;
BEGIN
    SELECT t.state INTO task_state FROM agent_tasks t
    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
    FOR SHARE;
    IF task_state = 'cancelled' THEN
        RAISE EXCEPTION 'agentdb: task % is cancelled; no message is sent for it', NEW.task_id
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- Citus: a trigger on a distributed table is created on its shards only
-- with this setting (as agentdb_distribute() does for the others).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$$;

-- G25, G20, G21
CREATE TRIGGER agent_steps_guard
    BEFORE INSERT OR UPDATE ON agent_steps
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_step();
-- G20: only a message that names a task calls it.
CREATE TRIGGER agent_outbox_for_open_task
    AFTER INSERT ON agent_outbox
    FOR EACH ROW WHEN (NEW.task_id IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_outbox_task();

ALTER TABLE agent_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_steps FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_steps_owner_all ON agent_steps
    TO CURRENT_USER USING (true) WITH CHECK (true);

-- The grants of 0023, redefined whole with the steps': the runtime records
-- and reads them (cross-tenant, as it claims); the agent reads its own
-- tenant's, never writes one (a step is written under a lease it never holds).
CREATE OR REPLACE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_grant_roles_0020();
    PERFORM set_config('client_min_messages', 'warning', true);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        GRANT SELECT, INSERT, UPDATE ON agent_schedules TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_fire_schedule(uuid, uuid) TO agentdb_runtime;
        DROP POLICY IF EXISTS agent_schedules_runtime_all ON agent_schedules;
        CREATE POLICY agent_schedules_runtime_all ON agent_schedules
            TO agentdb_runtime USING (true) WITH CHECK (true);
        GRANT SELECT, INSERT, UPDATE ON agent_steps TO agentdb_runtime;
        DROP POLICY IF EXISTS agent_steps_runtime_all ON agent_steps;
        CREATE POLICY agent_steps_runtime_all ON agent_steps
            TO agentdb_runtime USING (true) WITH CHECK (true);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        GRANT SELECT ON agent_steps TO agentdb_agent;
        -- Without the (SELECT ...) wrapper: Citus refuses sub-selects in policies.
        DROP POLICY IF EXISTS agent_steps_agent_scope ON agent_steps;
        CREATE POLICY agent_steps_agent_scope ON agent_steps FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
    END IF;
    PERFORM set_config('client_min_messages', 'notice', true);
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

-- G17: 0023's deletion policy, redefined whole with the tenant's steps
-- first (step 21): they refer to its tasks, which later steps delete. They
-- are a handler's working memory, not history: what the steps did is in
-- the operations and events the policy retains.
CREATE OR REPLACE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
    steps bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;
    IF p_dry_run THEN
        SELECT count(*) INTO steps FROM agent_steps s WHERE s.tenant_id = p_tenant;
        SELECT count(*) INTO n FROM agent_schedules s WHERE s.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_steps s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS steps = ROW_COUNT;
        DELETE FROM agent_schedules s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT * FROM agentdb_delete_tenant_0020(p_tenant, p_dry_run, p_actor);
    RETURN QUERY SELECT 20, 'agent_schedules', 'delete', n, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 21, 'agent_steps', 'delete', steps, NULL::timestamptz, NULL::text[];
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;

-- G9, G17: 0022's tasks purge, redefined whole: the steps of the tasks it may
-- take go first (they refer to them), by the same rules. A step is never
-- written for a finished task (agent_steps_guard), so none appears after.
CREATE OR REPLACE FUNCTION agentdb_purge_tasks(p_tenant uuid, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    PERFORM agentdb_purge_books(p_tenant, 'tasks', p_batch, p_older_than);
    -- Two statements each, not one with "p_tenant IS NULL OR": on Citus the
    -- tenant's must name it to route to its worker.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE k.tenant_id = s.tenant_id AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id);
        DELETE FROM agent_tasks t
        USING (SELECT k.tenant_id, k.id FROM agent_tasks k
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_operations op
                                 WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                                 WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_signals s
                                 WHERE s.tenant_id = k.tenant_id AND s.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_steps st
                                 WHERE st.tenant_id = k.tenant_id AND st.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                                 WHERE c.tenant_id = k.tenant_id AND c.parent_id = k.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE t.tenant_id = v.tenant_id AND t.id = v.id;
    ELSE
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE s.tenant_id = p_tenant AND k.tenant_id = p_tenant AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = p_tenant AND op.task_id = k.id);
        WITH v AS MATERIALIZED (
            SELECT k.id FROM agent_tasks k
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_operations op
                              WHERE op.tenant_id = p_tenant AND op.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                              WHERE ob.tenant_id = p_tenant AND ob.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_signals s
                              WHERE s.tenant_id = p_tenant AND s.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_steps st
                              WHERE st.tenant_id = p_tenant AND st.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                              WHERE c.tenant_id = p_tenant AND c.parent_id = k.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tasks(uuid, integer, interval) FROM PUBLIC;

-- Citus: the steps in the tenants' colocation group; their guard and the
-- outbox's read the task's colocated shard from inside a shard.
CREATE PROCEDURE agentdb_distribute_steps()
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_steps'::regclass) THEN
        -- Copying the rows of an installation into their shards is no write of a
        -- handler's: the guard (a finished task records no step) is paused for it,
        -- as 0015 and 0023 pause the others'.
        ALTER TABLE agent_steps DISABLE TRIGGER agent_steps_guard;
        PERFORM create_distributed_table('agent_steps', 'tenant_id', colocate_with => 'agent_tenants');
        ALTER TABLE agent_steps ENABLE TRIGGER agent_steps_guard;
    END IF;
    ALTER FUNCTION agentdb_guard_step() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_outbox_task() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_steps() FROM PUBLIC;

-- 0028's distribution, redefined whole: then the steps.
CREATE OR REPLACE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    paused text[] := '{}';
    name text;
    distributed boolean := true;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition p
                                WHERE p.logicalrelid = ''agent_events''::regclass)'
            INTO distributed;
    END IF;
    IF NOT distributed
       AND (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        FOR name IN
            SELECT t.tgname FROM pg_trigger t
            WHERE t.tgrelid = 'agent_events'::regclass AND NOT t.tgisinternal
              AND t.tgenabled <> 'D' AND t.tgtype & 5 = 5  -- row-level insert, as 0015
            ORDER BY t.tgname
        LOOP
            EXECUTE format('ALTER TABLE agent_events DISABLE TRIGGER %I', name);
            paused := paused || name;
        END LOOP;
    END IF;
    CALL agentdb_distribute_0027(p_shard_count);
    CALL agentdb_distribute_steps();
    FOREACH name IN ARRAY paused LOOP
        EXECUTE format('ALTER TABLE agent_events ENABLE TRIGGER %I', name);
    END LOOP;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;

-- Applied to an install that is distributed already.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute_steps();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0029.steps'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
