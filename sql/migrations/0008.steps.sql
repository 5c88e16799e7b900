-- 0008 steps: a durable handler's steps, recorded once per task and name
-- under the lease that ran them (G25).
-- depends: 0007.schedules
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

-- G25, G20, G21
CREATE TRIGGER agent_steps_guard
    BEFORE INSERT OR UPDATE ON agent_steps
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_step();

CALL agentdb_pin_search_paths();
