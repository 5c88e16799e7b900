-- 0006 control flow: a cancelled or finished task takes nothing more (G20),
-- a deadline ends a task (G21), a signal or an approval reaches its task
-- exactly once and in order (G22), and a parent is woken exactly once when
-- enough of its children have finished (G23).
-- depends: 0005.delivery
-- phase: expand
--
-- Cancel (G20). agentdb.tasks.cancel moves a task to 'cancelled' in one
-- versioned write with its event (task.cancelled), whatever state it is in
-- and whoever holds it: leaving 'running' drops the lease in the same write,
-- so the holder's next renew, reserve, settle or finish matches no row (its
-- fence names the lease it no longer has) and the runtime raises Cancelled.
-- 'cancelled' has no way out in agent_transitions, so no later write revives
-- the task. What the fences cannot see is a writer that presents no lease: a
-- raw INSERT of an operation, a raw re-arm of a failed one, a message
-- enqueued by the caller's own transaction with the task's id. The triggers
-- below refuse those for a finished (a message: a cancelled) task (AG012), so
-- a cancel is final for every writer, not only for the runtime. They lock the
-- task row FOR SHARE: a cancel (which updates the row) and the write
-- serialise, and whichever commits second sees the other. Operations
-- reserved before the cancel stay as they are, in the ledger, for reconcile:
-- a cancel never makes an effect disappear.
--
-- Deadlines (G21). A task may carry deadline_at. Once the deadline has
-- passed the claim path no longer takes it (agentdb/queries/leases.sql), and
-- the database refuses every write that would keep it alive - a claim, a
-- finish (succeeded or failed), a step, a release back to pending or
-- waiting, a lease renewed or handed over, a new operation - whoever writes
-- it (AG013); the only moves left are to 'dead' (which the sweep,
-- lease_expire_deadlines, makes with its event task.deadline_passed) and to
-- 'cancelled'. So a passed deadline never moves either (that write keeps the
-- task alive too), or a late finish could be let in by extending it. A
-- write's instant is its transaction's start, now(), as for every timestamp
-- the write records: a finish whose transaction began before the deadline
-- finished before it. The guard runs only for unfinished rows that carry a
-- deadline (its WHEN clause), so tasks without one pay nothing, and a
-- finished task's deadline is history.
--
-- Signals (G22). A signal is a row of agent_signals: a name, a payload, a
-- sender, and for an approval (kind 'approval') a decision. The database
-- gives each its place in the task's order (seq, 1, 2, ...): the insert
-- locks the task row (FOR NO KEY UPDATE), so two signals to one task
-- serialise and commit in seq order; a reader that has seen seq n has seen
-- everything before it. The same lock orders a signal against the task's own
-- writes, so a signal never slips between a handler deciding to wait and its
-- wait committing:
--
--   * the signal commits first - the wait's UPDATE (BEFORE trigger
--     agent_tasks_signal_guard) finds it unread (seq > signal_cursor) under
--     the name waited for, and makes the task due at once (wake_at = now());
--   * the wait commits first - the signal's AFTER trigger finds the task
--     'waiting' for its name and moves it to 'pending' with event task.woken,
--     in the signal's own transaction (agent_signals_notify wakes idle
--     workers, a hint as the others are; not on Citus, see 0012.citus).
--
-- A task reads its unread signals (seq > signal_cursor) and moves its cursor
-- on with the write that ends the run (a wait): the cursor only grows, and
-- never past the last signal (AG014), so a signal read is never read again
-- and one not yet read is not skipped. A run that crashes has moved nothing;
-- the next attempt reads the same signals.
--
-- Refused: a signal to a finished task (AG012) or one past its deadline
-- (AG013); an approval by anyone who holds or ever held the task's lease
-- (AG014: a holder that waited has released it; the claim events name every
-- holder) and any approval by the agentdb_agent role (its policy lets it send
-- plain signals to its own tenant's tasks only, G15); a signal to a task the
-- sender cannot see, or of another tenant (agent_signals_access, as the
-- sender under its row-level security: as if the task did not exist, 23503,
-- before agent_signals_guard - as the owner - says whether it is finished or
-- late; not left to the foreign key, which looks at the end of the statement,
-- when a task created meanwhile would pass with the guard's checks skipped);
-- a changed signal (they are facts, AG003). Every signal and approval is in
-- the audit trail (task.signalled, task.approved, task.rejected events, actor
-- the sender), written by the trigger, so raw SQL gets the same record as
-- the runtime. With a dedupe key a signal is recorded once: the same key
-- answers with the first signal; a different payload under it is a conflict
-- (G4, in the runtime). The sender is what the caller says it is: the
-- database cannot tell two services apart that connect as one role.
--
-- Children (G23). A child is a task with parent_id set: the composite
-- foreign key keeps it in its parent's tenant (G2), and (tenant_id,
-- parent_id, child_key) is unique, so a retried fan-out creates each child
-- once; its dedupe key 'child/<parent>/<key>' is reserved to it
-- (agent_tasks_child_dedupe_reserved). A finished parent, or one past its
-- deadline, takes no new child (AG012, AG013). The parent waits in
-- 'waiting' with wait_children = N (all of its children, or a quorum). Each
-- child's finish (AFTER UPDATE trigger agent_tasks_fan_in) locks the parent
-- row FOR NO KEY UPDATE - siblings take turns, foreign-key checks on the
-- parent are not blocked - and then counts the finished children in a
-- snapshot taken after the lock: children finishing at once serialise on the
-- parent, the last of them sees every sibling's finish, and the wake - to
-- 'pending', wait_children cleared, event task.children_done - happens once,
-- because the next finish finds the parent no longer waiting. A wait that
-- begins after the last child finished is not lost either: the wait's own
-- UPDATE (BEFORE trigger agent_tasks_children_guard) counts the same way and
-- makes the task due at once, as a signal already there does. A child's
-- result is the payload of its finishing event (agentdb.tasks.children
-- reads it).
--
-- Isolation (G22, G23). The wake-ups count what committed before a row
-- lock, in a snapshot taken after it. Only READ COMMITTED takes a new
-- snapshot per statement: under REPEATABLE READ or SERIALIZABLE a wait could
-- sleep on a signal it cannot see, and the last two children finishing at
-- once could each count the other as unfinished - nobody would wake the
-- parent. Those paths refuse any other level (AG015, AG016) where it would
-- matter: every signal, a wait that would sleep, a fan-in count.

-- G20: a finished task takes no new operation, and no failed one of it is
-- re-armed; nor does a task past its deadline (G21): a late task starts no
-- new effect. AFTER the row is written, so a replayed reservation (its key
-- already taken: ON CONFLICT DO NOTHING inserts nothing) still returns the
-- operation that holds the key.
CREATE FUNCTION agentdb_guard_open_task() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    task_state text;
    task_deadline timestamptz;
BEGIN
    SELECT t.state, t.deadline_at INTO task_state, task_deadline FROM agent_tasks t
    WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
    FOR SHARE;
    IF task_state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; nothing more is reserved for it',
                NEW.task_id, task_state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF task_deadline <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; nothing more is reserved '
                        'for it', NEW.task_id, task_deadline
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G20, G21: a new operation for a finished task, or one past its deadline.
-- Its triggers fire before agent_operations_rate_limit (triggers fire in name
-- order), so a reservation for a finished task is reported as that, not as a
-- rate limit, and takes no lock on the limit's row (either refusal undoes the
-- whole statement, its count included).
CREATE TRIGGER agent_operations_for_open_task
    AFTER INSERT ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_open_task();
-- G20, G21: a failed operation re-armed for a finished task, or a late one.
CREATE TRIGGER agent_operations_for_open_task_retry
    AFTER UPDATE OF state ON agent_operations
    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')
    EXECUTE FUNCTION agentdb_guard_open_task();

-- G20: no message names a cancelled task, whoever writes it - the runtime's
-- fenced writes could not see a message a caller's own transaction writes
-- with the task's id. AFTER, as the operations' guard: a replayed insert (ON
-- CONFLICT DO NOTHING) wrote nothing to refuse. Locks the task row FOR
-- SHARE, so a cancel and the message serialise and whichever commits second
-- sees the other.
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

-- G20: only a message that names a task calls it.
CREATE TRIGGER agent_outbox_for_open_task
    AFTER INSERT ON agent_outbox
    FOR EACH ROW WHEN (NEW.task_id IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_outbox_task();

-- G21
CREATE FUNCTION agentdb_guard_deadline() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.deadline_at > now() THEN
        RETURN NEW;
    END IF;
    -- Whatever else the write changes - the state, a step, the deadline itself
    -- (pushed back to let a late finish in) - only an end gets through.
    IF NEW.state NOT IN ('dead', 'cancelled') THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it can only be moved to dead '
                        'or cancelled, not to %', OLD.id, OLD.deadline_at, NEW.state
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G21: every UPDATE, not only of state: a step, a lease renewed or handed
-- over, are writes that keep a task alive too. Only an unfinished task with
-- a deadline calls the function.
CREATE TRIGGER agent_tasks_deadline_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (OLD.deadline_at IS NOT NULL AND OLD.state IN ('pending', 'waiting', 'running'))
    EXECUTE FUNCTION agentdb_guard_deadline();

-- G21: the sweep's path to unfinished tasks whose deadline passed.
CREATE INDEX agent_tasks_deadline_idx ON agent_tasks (deadline_at)
    WHERE deadline_at IS NOT NULL AND state IN ('pending', 'waiting', 'running');

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

-- G22, G23: the wake-ups need a snapshot per statement. p_code: AG015 for
-- a signal's rules (G22), AG016 for a fan-in's (G23).
CREATE FUNCTION agentdb_require_read_committed(p_code text, p_object text, p_table text)
    RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'agentdb: % counts what committed before its lock, which a % transaction cannot see',
                p_object, current_setting('transaction_isolation')
            USING ERRCODE = p_code, CONSTRAINT = p_object, TABLE = p_table,
                  HINT = 'Run it at READ COMMITTED (the default isolation level).';
    END IF;
END
$$;

-- G22, G2: as the sender, under its row-level security. A task it cannot see
-- is refused here, as the foreign key would refuse a task that does not
-- exist - and before agent_signals_guard (as the owner, next by name) locks
-- it and says whether it is finished or late. Not left to the foreign key:
-- that looks at the end of the statement, when a task created meanwhile
-- would pass it with the guard's checks skipped.
-- Its messages name the constraint as Postgres's own foreign-key errors do:
-- Citus drops the CONSTRAINT field of a worker's error, and the driver layer
-- then reads the name from the message (agentdb/_db/execute.py).
CREATE FUNCTION agentdb_signal_access() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = NEW.tenant_id) THEN
        RAISE EXCEPTION 'agentdb: no tenant % to signal in (violates foreign key constraint "agent_signals_tenant_fkey")',
                        NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_tenant_fkey',
                  TABLE = TG_TABLE_NAME;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agent_tasks k
                   WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id) THEN
        RAISE EXCEPTION 'agentdb: no task % in tenant % to signal (violates foreign key constraint "agent_signals_task_fkey")',
                        NEW.task_id, NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_task_fkey',
                  TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G22: lock the task, refuse what it may not take, give the signal its place.
-- SECURITY DEFINER: the agent role sends signals but may not lock tasks.
CREATE FUNCTION agentdb_guard_signal() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    task record;
BEGIN
    PERFORM agentdb_require_read_committed('AG015', TG_NAME, TG_TABLE_NAME);
    SELECT k.state, k.deadline_at, k.lease_owner INTO task FROM agent_tasks k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.task_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN  -- deleted since agent_signals_access saw it
        RAISE EXCEPTION 'agentdb: no task % in tenant % to signal (violates foreign key constraint "agent_signals_task_fkey")',
                        NEW.task_id, NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_signals_task_fkey',
                  TABLE = TG_TABLE_NAME;
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
    -- The claim events name every holder the task had (actor_id = lease_owner).
    IF NEW.kind = 'approval' AND (NEW.sender = task.lease_owner
        OR EXISTS (SELECT 1 FROM agent_events e
                   WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id
                     AND e.event_type IN ('task.claimed', 'task.reclaimed')
                     AND e.actor_id = NEW.sender)) THEN
        RAISE EXCEPTION 'agentdb: % holds or held task % and cannot approve its own work',
                NEW.sender, NEW.task_id
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
-- signal that is already there (unread) is due at once. A wait that sleeps
-- must have looked in a snapshot taken after its row lock.
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
    IF NEW.state = 'waiting' AND NEW.wait_signal IS NOT NULL AND NEW.wake_at > now() THEN
        IF EXISTS (SELECT 1 FROM agent_signals s
                   WHERE s.tenant_id = NEW.tenant_id AND s.task_id = NEW.id
                     AND s.seq > NEW.signal_cursor AND s.name = NEW.wait_signal) THEN
            NEW.wake_at := now();
        ELSE
            PERFORM agentdb_require_read_committed('AG015', TG_NAME, TG_TABLE_NAME);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- G22: fires before agent_signals_guard (triggers fire by name).
CREATE TRIGGER agent_signals_access
    BEFORE INSERT ON agent_signals
    FOR EACH ROW EXECUTE FUNCTION agentdb_signal_access();
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

-- G23, G20, G21: a finished parent, or one past its deadline, takes no new child.
CREATE FUNCTION agentdb_guard_child() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    parent record;
BEGIN
    SELECT p.state, p.deadline_at INTO parent FROM agent_tasks p
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    FOR SHARE;
    IF parent.state IN ('succeeded', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'agentdb: task % is %; it takes no new child', NEW.parent_id, parent.state
            USING ERRCODE = 'AG012', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF parent.deadline_at <= now() THEN
        RAISE EXCEPTION 'agentdb: task % passed its deadline at %; it takes no new child',
                NEW.parent_id, parent.deadline_at
            USING ERRCODE = 'AG013', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G23: how many of a task's children have finished, counted in a fresh
-- snapshot (VOLATILE). PL/pgSQL for the reason agentdb_running_count is.
CREATE FUNCTION agentdb_children_done(p_tenant uuid, p_parent uuid) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM agent_tasks c
    WHERE c.tenant_id = p_tenant AND c.parent_id = p_parent
      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead');
    RETURN n;
END
$$;

-- G23: a child finished - wake its parent if it was the one the parent waited for.
CREATE FUNCTION agentdb_fan_in() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    parent record;
    woken record;
BEGIN
    -- The lock first, the count after it (a new snapshot): siblings finishing at
    -- once take turns here, and the last one counts them all.
    SELECT p.state, p.wait_children, p.deadline_at INTO parent FROM agent_tasks p
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    FOR NO KEY UPDATE;
    -- A parent past its deadline is not woken (G21 would refuse it, and with it
    -- the child's finish): the sweep ends it.
    IF parent.state IS DISTINCT FROM 'waiting' OR parent.wait_children IS NULL
       OR parent.deadline_at <= now() THEN
        RETURN NULL;
    END IF;
    PERFORM agentdb_require_read_committed('AG016', TG_NAME, TG_TABLE_NAME);
    IF agentdb_children_done(NEW.tenant_id, NEW.parent_id) < parent.wait_children THEN
        RETURN NULL;
    END IF;
    UPDATE agent_tasks p
    SET state = 'pending', state_version = p.state_version + 1, wake_at = now(),
        wait_children = NULL, updated_at = now()
    WHERE p.tenant_id = NEW.tenant_id AND p.id = NEW.parent_id
    RETURNING p.state_version, p.workflow_version, p.trace_id, p.span_id INTO woken;
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload,
                              trace_id, span_id)
    VALUES (NEW.tenant_id, NEW.parent_id, 'task.children_done', 'agentdb', woken.workflow_version,
            'waiting', 'pending', woken.state_version,
            jsonb_build_object('waited_for', parent.wait_children, 'last_child', NEW.id),
            woken.trace_id, woken.span_id);
    RETURN NULL;
END
$$;

-- G23: a wait for children that have finished already is due at once; one
-- that sleeps must have counted in a snapshot taken after its row lock.
CREATE FUNCTION agentdb_guard_children_wait() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.wake_at > now() THEN
        IF agentdb_children_done(NEW.tenant_id, NEW.id) >= NEW.wait_children THEN
            NEW.wake_at := now();
        ELSE
            PERFORM agentdb_require_read_committed('AG016', TG_NAME, TG_TABLE_NAME);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- G17: a parent stays while its children do. The purge takes a finished task
-- only once no child refers to it (agentdb_purge_tasks, 0011.retention); the
-- tenant deletion's "tasks with no retained events" step deletes a parent and
-- its children in one statement, and a parent whose child keeps its audit
-- trail (or children of its own) is kept with it, for the next run. A row
-- trigger that returns NULL keeps the row: the deletion goes on without it.
CREATE FUNCTION agentdb_keep_parent() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_tasks c
               WHERE c.tenant_id = OLD.tenant_id AND c.parent_id = OLD.id
                 AND (EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = c.tenant_id AND e.task_id = c.id)
                      OR EXISTS (SELECT 1 FROM agent_tasks g
                                 WHERE g.tenant_id = c.tenant_id AND g.parent_id = c.id))) THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END
$$;

-- G23, G20, G21: only a child's insert calls it.
CREATE TRIGGER agent_tasks_child_guard
    BEFORE INSERT ON agent_tasks
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_child();
-- G23: only a child's finish calls it.
CREATE TRIGGER agent_tasks_fan_in
    AFTER UPDATE OF state ON agent_tasks
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL
                       AND NEW.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                       AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled', 'dead'))
    EXECUTE FUNCTION agentdb_fan_in();
-- G17: a parent is not deleted from under its children.
CREATE TRIGGER agent_tasks_keep_parent
    BEFORE DELETE ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_keep_parent();
-- G23: only a wait for children calls it.
CREATE TRIGGER agent_tasks_children_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (NEW.state = 'waiting' AND NEW.wait_children IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_children_wait();

CALL agentdb_pin_search_paths();
