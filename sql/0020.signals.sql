-- 0020 signals: a signal or an approval reaches its task exactly once, in
-- order, and wakes it as it commits (G22).
-- depends: 0019.deadlines
-- phase: expand
--
-- A signal is a row of agent_signals: a name, a payload, a sender, and for
-- an approval (kind 'approval') a decision. The database gives each its
-- place in the task's order (seq, 1, 2, ...): the insert locks the task row
-- (FOR NO KEY UPDATE), so two signals to one task serialise and commit in
-- seq order; a reader that has seen seq n has seen everything before it.
-- The same lock orders a signal against the task's own writes, so a signal
-- never slips between a handler deciding to wait and its wait committing:
--
--   * the signal commits first - the wait's UPDATE (BEFORE trigger
--     agent_tasks_signal_guard) finds it unread (seq > signal_cursor) under
--     the name waited for, and makes the task due at once (wake_at = now());
--   * the wait commits first - the signal's AFTER trigger finds the task
--     'waiting' for its name and moves it to 'pending' with event task.woken,
--     in the signal's own transaction (agent_signals_notify wakes idle
--     workers, a hint as 0008's; not on Citus, as 0013 says).
--
-- A task reads its unread signals (seq > signal_cursor) and moves its cursor
-- on with the write that ends the run (a wait): the cursor only grows, and
-- never past the last signal (AG014), so a signal read is never read again
-- and one not yet read is not skipped. A run that crashes has moved nothing;
-- the next attempt reads the same signals.
--
-- Refused: a signal to a finished task (AG012) or one past its deadline
-- (AG013); an approval by the task's own lease holder (AG014), and any
-- approval by the agentdb_agent role (its policy lets it send plain signals
-- to its own tenant's tasks only, G15); a signal to another tenant's task
-- (the composite foreign key, G2); a changed signal (they are facts, AG003).
-- Every signal and approval is in the audit trail (task.signalled,
-- task.approved, task.rejected events, actor the sender), written by the
-- trigger, so raw SQL gets the same record as the runtime. With a dedupe
-- key a signal is recorded once: the same key answers with the first
-- signal; a different payload under it is a conflict (G4, in the runtime).

-- G22: the task's wait and its place in its signals.
ALTER TABLE agent_tasks ADD COLUMN wait_signal text;
ALTER TABLE agent_tasks ADD COLUMN signal_cursor bigint NOT NULL DEFAULT 0;
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_wait_signal_valid
    CHECK (length(wait_signal) BETWEEN 1 AND 100);
ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_signal_cursor_valid
    CHECK (signal_cursor >= 0);

CREATE TABLE agent_signals (
    id          uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id   uuid        NOT NULL,
    task_id     uuid        NOT NULL,
    -- G22: set by agent_signals_guard, whatever the INSERT says.
    seq         bigint      NOT NULL,
    name        text        NOT NULL,
    kind        text        NOT NULL DEFAULT 'signal',
    decision    text,
    payload     jsonb       NOT NULL DEFAULT '{}',
    sender      text        NOT NULL,
    dedupe_key  text,
    input_hash  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_signals_pkey PRIMARY KEY (tenant_id, id),
    -- G2: tenant_id must name a tenant; a signal belongs to a task of its own tenant.
    CONSTRAINT agent_signals_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    CONSTRAINT agent_signals_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    -- G22: one place per signal in its task's order.
    CONSTRAINT agent_signals_seq_key UNIQUE (tenant_id, task_id, seq),
    -- G3: one signal per dedupe key per task.
    CONSTRAINT agent_signals_dedupe_key UNIQUE (tenant_id, task_id, dedupe_key),
    -- G5
    CONSTRAINT agent_signals_seq_valid CHECK (seq >= 1),
    CONSTRAINT agent_signals_name_valid CHECK (length(name) BETWEEN 1 AND 100),
    CONSTRAINT agent_signals_kind_valid CHECK (kind IN ('signal', 'approval')),
    -- G22: an approval carries a decision, a plain signal none.
    CONSTRAINT agent_signals_decision_valid
        CHECK ((kind = 'approval') = (decision IS NOT NULL) AND decision IN ('approved', 'rejected')),
    -- G5
    CONSTRAINT agent_signals_sender_valid CHECK (length(sender) BETWEEN 1 AND 200),
    -- G4
    CONSTRAINT agent_signals_dedupe_has_hash CHECK ((dedupe_key IS NULL) = (input_hash IS NULL)),
    CONSTRAINT agent_signals_dedupe_key_valid CHECK (length(dedupe_key) BETWEEN 1 AND 255),
    CONSTRAINT agent_signals_input_hash_format CHECK (input_hash ~ '^[0-9a-f]{64}$'),
    -- G9: bounded, like a task's params.
    CONSTRAINT agent_signals_payload_valid
        CHECK (jsonb_typeof(payload) = 'object' AND octet_length(payload::text) <= 65536)
);

-- G22: lock the task, refuse what it may not take, give the signal its place.
-- SECURITY DEFINER: the agent role sends signals but may not lock tasks.
CREATE FUNCTION agentdb_guard_signal() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task record;
BEGIN
    SELECT k.state, k.deadline_at, k.lease_owner INTO task FROM agent_tasks k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        NEW.seq := 1;  -- a placeholder for agent_signals_task_fkey to refuse (G2)
        RETURN NEW;
    END IF;
    IF task.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it takes no more signals', NEW.task_id, task.state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task.deadline_at <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it takes no more signals',
                NEW.task_id, task.deadline_at
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.kind = 'approval' AND NEW.sender = task.lease_owner THEN
        RAISE EXCEPTION 'agentdb: % holds task % and cannot approve its own work', NEW.sender, NEW.task_id
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    -- Read under the lock, in a snapshot taken after it: every signal that
    -- committed before this one is counted.
    NEW.seq := 1 + coalesce((SELECT max(s.seq) FROM agent_signals s
                             WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.task_id), 0);
    RETURN NEW;
END
$$;

-- G22: record the signal in the audit trail (G8); wake a task waiting for it.
CREATE FUNCTION agentdb_deliver_signal() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    woken record;
    facts jsonb := jsonb_build_object('signal', NEW.name, 'seq', NEW.seq, 'signal_id', NEW.id,
                                      'kind', NEW.kind, 'decision', NEW.decision);
BEGIN
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              payload, trace_id, span_id)
    SELECT NEW.tenant_id, NEW.task_id,
           CASE WHEN NEW.kind = 'approval' THEN 'task.' || NEW.decision ELSE 'task.signalled' END,
           NEW.sender, k.workflow_version, jsonb_strip_nulls(facts), k.trace_id, k.span_id
    FROM agent_tasks k WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id;
    UPDATE agent_tasks k
    SET state = 'pending', state_version = k.state_version + 1, wake_at = now(),
        wait_signal = NULL, updated_at = now()
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
      AND k.state = 'waiting' AND k.wait_signal = NEW.name
    RETURNING k.state_version, k.workflow_version, k.trace_id, k.span_id INTO woken;
    IF FOUND THEN
        INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                  from_state, to_state, task_state_version, payload,
                                  trace_id, span_id)
        VALUES (NEW.tenant_id, NEW.task_id, 'task.woken', NEW.sender, woken.workflow_version,
                'waiting', 'pending', woken.state_version,
                jsonb_build_object('signal', NEW.name, 'seq', NEW.seq),
                woken.trace_id, woken.span_id);
    END IF;
    RETURN NULL;
END
$$;

-- G22: signals are facts; a changed one would rewrite what a task was told.
CREATE FUNCTION agentdb_guard_signal_immutable() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'agentdb: signal % of task % is recorded; it cannot be changed', OLD.seq, OLD.task_id
        USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

-- G22: the cursor only grows, never past the last signal; a wait for a
-- signal that is already there (unread) is due at once.
CREATE FUNCTION agentdb_guard_signal_cursor() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF NEW.signal_cursor < OLD.signal_cursor THEN
        RAISE EXCEPTION 'agentdb: the signal cursor of task % moves back (% -> %)',
                NEW.id, OLD.signal_cursor, NEW.signal_cursor
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.signal_cursor > OLD.signal_cursor
       AND NOT EXISTS (SELECT 1 FROM agent_signals s
                       WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                         AND s.seq = NEW.signal_cursor) THEN
        RAISE EXCEPTION 'agentdb: task % has no signal % to have read', NEW.id, NEW.signal_cursor
            USING ERRCODE = 'AG014', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.state = 'waiting' AND NEW.wait_signal IS NOT NULL AND NEW.wake_at > now()
       AND EXISTS (SELECT 1 FROM agent_signals s
                   WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal) THEN
        NEW.wake_at := now();
    END IF;
    RETURN NEW;
END
$$;

-- Citus: a trigger on a distributed table reaches its shards only with this
-- setting (as agentdb_distribute() does for the others).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    END IF;
END
$$;

-- G22, G20, G21
CREATE TRIGGER agent_signals_guard
    BEFORE INSERT ON agent_signals
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_signal();
-- G22: AFTER, so a signal whose key was taken (ON CONFLICT DO NOTHING)
-- records nothing and wakes nobody.
CREATE TRIGGER agent_signals_deliver
    AFTER INSERT ON agent_signals
    FOR EACH ROW EXECUTE FUNCTION agentdb_deliver_signal();
-- A hint no guarantee rests on: a signal (which may have woken its task) wakes idle workers.
CREATE TRIGGER agent_signals_notify
    AFTER INSERT ON agent_signals
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_notify('agentdb_tasks');
-- G22
CREATE TRIGGER agent_signals_immutable
    BEFORE UPDATE ON agent_signals
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_signal_immutable();
-- G22: only writes that move the cursor or wait for a signal call it.
CREATE TRIGGER agent_tasks_signal_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (NEW.signal_cursor <> OLD.signal_cursor
                       OR (NEW.state = 'waiting' AND NEW.wait_signal IS NOT NULL))
    EXECUTE FUNCTION agentdb_guard_signal_cursor();

ALTER TABLE agent_signals ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_signals FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_signals_owner_all ON agent_signals
    TO CURRENT_USER USING (true) WITH CHECK (true);

-- The grants of 0014 (kept as agentdb_grant_roles_0014), then the signals':
-- the runtime sends and reads them (cross-tenant, as it claims); the agent
-- reads its own tenant's and sends plain signals to them - never an
-- approval (G15, G22: an agent does not approve its own work).
ALTER PROCEDURE agentdb_grant_roles() RENAME TO agentdb_grant_roles_0014;
CREATE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_grant_roles_0014();
    PERFORM set_config('client_min_messages', 'warning', true);
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        GRANT SELECT, INSERT ON agent_signals TO agentdb_runtime;
        DROP POLICY IF EXISTS agent_signals_runtime_all ON agent_signals;
        CREATE POLICY agent_signals_runtime_all ON agent_signals
            TO agentdb_runtime USING (true) WITH CHECK (true);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        GRANT SELECT, INSERT ON agent_signals TO agentdb_agent;
        -- Without the (SELECT ...) wrapper: Citus refuses sub-selects in policies.
        DROP POLICY IF EXISTS agent_signals_agent_scope ON agent_signals;
        CREATE POLICY agent_signals_agent_scope ON agent_signals FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
        DROP POLICY IF EXISTS agent_signals_agent_send ON agent_signals;
        CREATE POLICY agent_signals_agent_send ON agent_signals FOR INSERT TO agentdb_agent
            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');
    END IF;
    PERFORM set_config('client_min_messages', 'notice', true);
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles_0014() FROM PUBLIC;

-- G17: the deletion policy of 0014 (kept as agentdb_delete_tenant_0014),
-- after the tenant's signals (step 19): they refer to its tasks, which the
-- earlier steps delete. What was signalled stays in the retained events.
ALTER FUNCTION agentdb_delete_tenant(uuid, boolean, text) RENAME TO agentdb_delete_tenant_0014;
CREATE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_signals s WHERE s.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_signals s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT * FROM agentdb_delete_tenant_0014(p_tenant, p_dry_run, p_actor);
    RETURN QUERY SELECT 19, 'agent_signals', 'delete', n, NULL::timestamptz, NULL::text[];
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant_0014(uuid, boolean, text) FROM PUBLIC;

-- G9: retention. A finished task the purge may take can have signals, whose
-- foreign key would refuse it; they go first, by the purge's own rules (as
-- agentdb_purge_books does for budgets). Every signal has an event, so a
-- task's signals are only purged once its retained events are.
CREATE FUNCTION agentdb_purge_signals(p_tenant uuid, p_kind text, p_older_than interval)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'tasks' THEN
        DELETE FROM agent_signals s
        USING agent_tasks k
        WHERE k.tenant_id = s.tenant_id AND k.id = s.task_id
          AND (p_tenant IS NULL OR s.tenant_id = p_tenant)
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                          WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                          WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id);
    END IF;
END
$$;

ALTER FUNCTION agentdb_purge(text, integer, interval) RENAME TO agentdb_purge_0014;
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    PERFORM agentdb_purge_signals(NULL, p_kind, p_older_than);
    RETURN agentdb_purge_0014(p_kind, p_batch, p_older_than);
END
$$;
ALTER FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant_0014;
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    PERFORM agentdb_purge_signals(p_tenant, p_kind, p_older_than);
    RETURN agentdb_purge_tenant_0014(p_tenant, p_kind, p_batch, p_older_than);
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge_signals(uuid, text, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_0014(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant_0014(uuid, text, integer, interval) FROM PUBLIC;

-- 0018's distribution (kept as agentdb_distribute_0018), with the signals in
-- the tenants' colocation group; their triggers and the task's cursor guard
-- reach the colocated shards of the other table from inside a shard.
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0018;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
BEGIN
    CALL agentdb_distribute_0018(p_shard_count);
    CALL agentdb_distribute_signals();
END
$$;
CREATE PROCEDURE agentdb_distribute_signals()
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    -- As 0013 does for the others: a NOTIFY would break PREPARE TRANSACTION.
    IF EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = 'agent_signals'::regclass
                                            AND g.tgname = 'agent_signals_notify') THEN
        DROP TRIGGER agent_signals_notify ON agent_signals;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_signals'::regclass) THEN
        PERFORM create_distributed_table('agent_signals', 'tenant_id', colocate_with => 'agent_tenants');
    END IF;
    ALTER FUNCTION agentdb_guard_signal() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_deliver_signal() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_signal_cursor() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0018(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_signals() FROM PUBLIC;

-- Applied to an install that is distributed already.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute_signals();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0020.signals'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
