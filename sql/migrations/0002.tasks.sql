-- 0002 tasks: the user-level workflow (G1), with its lease (G12), version
-- (G7), dedupe key (G3) and trace linkage (G16); the fair claim's caps (G18).
-- depends: 0001.foundation
-- phase: expand
--
-- The article's agent_tasks columns are all here, unchanged in meaning. The
-- primary key leads with tenant_id (the article's UNIQUE (tenant_id, id)) so
-- every child can reference (tenant_id, id) and Citus can distribute by tenant.
-- The columns the control flow needs (a deadline, a wait for a signal or for
-- children, a schedule's tick) are here too, so the table reads whole; the
-- guards that give them meaning are in 0006.control_flow and 0007.schedules.
--
-- The claim (agentdb/queries/leases.sql, lease_claim) walks the tenants that
-- have due work round-robin and gives each its share of the batch: a tenant
-- with a large backlog does not delay every other tenant's first task by the
-- whole backlog. The due index leads with (tenant_id, task_type) so that walk
-- and each tenant's pick are index probes, whatever the backlog.
--
-- A tenant - or one task type of a tenant - may be capped: at most
-- max_running of its tasks run at once. The claim respects the caps, and a
-- trigger refuses any write that would exceed one (AG009), so hand-typed
-- SQL cannot either. The trigger counts running tasks instead of keeping a
-- counter: a count cannot drift, and finishing a task needs no extra write.

CREATE TABLE agent_tasks (
    id                uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id         uuid        NOT NULL,
    task_type         text        NOT NULL,
    workflow_version  text        NOT NULL,
    state             text        NOT NULL DEFAULT 'pending',
    state_version     bigint      NOT NULL DEFAULT 0,
    current_step      text,
    -- Due time for pending/waiting tasks; 'infinity' waits for a signal.
    wake_at           timestamptz DEFAULT now(),
    -- G3/G4 for task creation: a retried "create task" request carries the same
    -- dedupe key and must carry the same input_hash.
    dedupe_key        text,
    input_hash        text,
    -- G14: step-local values only; anything a policy or index needs is a column.
    params            jsonb       NOT NULL DEFAULT '{}',
    attempts          integer     NOT NULL DEFAULT 0,
    max_attempts      integer     NOT NULL DEFAULT 10,
    last_error        text,
    -- G12: lease_token grows with every grant and fences every holder's write.
    lease_ttl         interval    NOT NULL DEFAULT interval '5 minutes',
    lease_owner       text,
    lease_token       bigint      NOT NULL DEFAULT 0,
    lease_acquired_at timestamptz,
    lease_expires_at  timestamptz,
    trace_id          text,
    span_id           text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- G21: after it, nothing moves the task but the way out (dead or cancelled).
    deadline_at       timestamptz,
    -- G22: the signal the task waits for, and its place in its signals (the
    -- last one it read).
    wait_signal       text,
    signal_cursor     bigint      NOT NULL DEFAULT 0,
    -- G23: a child's parent and its key among the parent's children; how many
    -- finished children the parent waits for.
    parent_id         uuid,
    child_key         text,
    wait_children     integer,
    -- G24: which tick of which schedule the task is.
    schedule_id       uuid,
    schedule_tick     timestamptz,
    CONSTRAINT agent_tasks_pkey PRIMARY KEY (tenant_id, id),
    -- G2: tenant_id must name a tenant; RESTRICT, deletion follows G17's routine.
    CONSTRAINT agent_tasks_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    -- G3: one task per dedupe key per tenant.
    CONSTRAINT agent_tasks_dedupe_key UNIQUE (tenant_id, dedupe_key),
    -- G5: state set, versions, counters, lengths.
    CONSTRAINT agent_tasks_state_valid
        CHECK (state IN ('pending', 'waiting', 'running', 'succeeded', 'failed', 'cancelled', 'dead')),
    CONSTRAINT agent_tasks_state_version_valid CHECK (state_version >= 0),
    CONSTRAINT agent_tasks_task_type_valid CHECK (length(task_type) BETWEEN 1 AND 200),
    CONSTRAINT agent_tasks_workflow_version_valid CHECK (length(workflow_version) BETWEEN 1 AND 100),
    CONSTRAINT agent_tasks_current_step_valid CHECK (length(current_step) BETWEEN 1 AND 200),
    CONSTRAINT agent_tasks_due_has_wake_at CHECK (state NOT IN ('pending', 'waiting') OR wake_at IS NOT NULL),
    CONSTRAINT agent_tasks_attempts_valid CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT agent_tasks_last_error_valid CHECK (length(last_error) <= 4000),
    -- G4: a dedupe key always comes with the hash of the request it answered.
    CONSTRAINT agent_tasks_dedupe_has_hash CHECK ((dedupe_key IS NULL) = (input_hash IS NULL)),
    CONSTRAINT agent_tasks_dedupe_key_valid CHECK (length(dedupe_key) BETWEEN 1 AND 255),
    CONSTRAINT agent_tasks_input_hash_format CHECK (input_hash ~ '^[0-9a-f]{64}$'),
    -- G9: no unbounded blobs in a row that every claim touches.
    CONSTRAINT agent_tasks_params_valid
        CHECK (jsonb_typeof(params) = 'object' AND octet_length(params::text) <= 65536),
    -- G12: a lease is all three columns or none; running means leased.
    CONSTRAINT agent_tasks_lease_complete CHECK (
        (lease_owner IS NULL) = (lease_acquired_at IS NULL)
        AND (lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT agent_tasks_lease_window CHECK (lease_expires_at > lease_acquired_at),
    CONSTRAINT agent_tasks_running_is_leased CHECK ((state = 'running') = (lease_owner IS NOT NULL)),
    CONSTRAINT agent_tasks_lease_owner_valid CHECK (length(lease_owner) BETWEEN 1 AND 200),
    CONSTRAINT agent_tasks_lease_token_valid CHECK (lease_token >= 0),
    CONSTRAINT agent_tasks_lease_ttl_valid
        CHECK (lease_ttl >= interval '1 second' AND lease_ttl <= interval '1 day'),
    -- G16: W3C trace-context ids, lowercase hex, not all zero.
    CONSTRAINT agent_tasks_trace_id_format
        CHECK (trace_id ~ '^[0-9a-f]{32}$' AND trace_id <> '00000000000000000000000000000000'),
    CONSTRAINT agent_tasks_span_id_format
        CHECK (span_id ~ '^[0-9a-f]{16}$' AND span_id <> '0000000000000000'),
    -- G5
    CONSTRAINT agent_tasks_wait_signal_valid CHECK (length(wait_signal) BETWEEN 1 AND 100),
    CONSTRAINT agent_tasks_signal_cursor_valid CHECK (signal_cursor >= 0),
    -- G2: a child is in its parent's tenant.
    CONSTRAINT agent_tasks_parent_fkey
        FOREIGN KEY (tenant_id, parent_id) REFERENCES agent_tasks (tenant_id, id),
    -- G23: one child per key per parent; its index is also the lookup every
    -- fan-in count and child listing makes (tenant_id, parent_id leading).
    CONSTRAINT agent_tasks_child_key UNIQUE (tenant_id, parent_id, child_key),
    -- G5
    CONSTRAINT agent_tasks_child_key_valid
        CHECK (child_key IS NULL OR (length(child_key) BETWEEN 1 AND 200 AND parent_id IS NOT NULL)),
    CONSTRAINT agent_tasks_wait_children_valid CHECK (wait_children >= 1),
    -- G23: a child's dedupe key ('child/<parent>/<key>') is its parent's and
    -- key's alone: no other task may take it, so no one can squat a child's
    -- place before its parent creates it.
    CONSTRAINT agent_tasks_child_dedupe_reserved
        CHECK (dedupe_key IS NULL OR left(dedupe_key, 6) <> 'child/'
               OR (parent_id IS NOT NULL AND child_key IS NOT NULL
                   AND dedupe_key = 'child/' || parent_id::text || '/' || child_key)),
    -- G24: one task per schedule tick.
    CONSTRAINT agent_tasks_schedule_tick_key UNIQUE (tenant_id, schedule_id, schedule_tick),
    -- G5
    CONSTRAINT agent_tasks_schedule_tick_valid CHECK ((schedule_id IS NULL) = (schedule_tick IS NULL))
);

-- G18: the claim path: only due-able rows are in the index, so it stays small
-- however many finished tasks the table holds. Tenant-leading, so the claim's
-- walk over the tenants and their task types, and its pick inside one of
-- them, are index probes however long the backlog (and Citus can route them
-- by tenant).
CREATE INDEX agent_tasks_due_idx ON agent_tasks (tenant_id, task_type, wake_at)
    WHERE state IN ('pending', 'waiting');
-- G12: the recovery path: running tasks whose lease ran out.
CREATE INDEX agent_tasks_lease_expiry_idx ON agent_tasks (lease_expires_at)
    WHERE state = 'running';
-- G18: what a cap counts; only running rows are in it.
CREATE INDEX agent_tasks_running_idx ON agent_tasks (tenant_id, task_type)
    WHERE state = 'running';
-- G9: the retention path (agentdb_purge 'tasks', 0011.retention).
CREATE INDEX agent_tasks_finished_idx ON agent_tasks (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled', 'dead');

-- G7 + G2 + G4 + G12: versioned rows. TG_ARGV[0] is 'task' or 'operation'.
-- Every UPDATE moves state_version by exactly +1, except a lease heartbeat
-- that changes nothing but lease_expires_at and updated_at (so renewing does
-- not invalidate other writers' expectations) and an UPDATE that changes
-- nothing at all. Identity never changes (AG004, G2): tenant_id (Citus
-- cannot update it), id, created_at. What a key was issued for never changes
-- (AG008, G4): a task's type, dedupe key and input hash; an operation's
-- task, idempotency key, action and input hash - otherwise a stored result
-- could be re-pointed at a different request. Lease tokens never go
-- backwards and every new lease grant takes a new token (AG005, G12).
-- Table-specific checks are nested IFs: PL/pgSQL resolves every NEW.column in
-- an expression, so a column the other table lacks must not be reached.
CREATE FUNCTION agentdb_guard_version() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    probe record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state_version <> 0 THEN
            RAISE EXCEPTION 'agentdb: a new % row starts at state_version 0, not %', TG_TABLE_NAME, NEW.state_version
                USING ERRCODE = 'AG002', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'agentdb: the identity columns of % are immutable', TG_TABLE_NAME
            USING ERRCODE = 'AG004', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.input_hash IS DISTINCT FROM OLD.input_hash THEN
        RAISE EXCEPTION 'agentdb: the input_hash of a % row is bound to its key', TG_TABLE_NAME
            USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        IF NEW.task_type IS DISTINCT FROM OLD.task_type
           OR NEW.dedupe_key IS DISTINCT FROM OLD.dedupe_key THEN
            RAISE EXCEPTION 'agentdb: the dedupe key and task type of % are bound to its request', TG_TABLE_NAME
                USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
        IF NEW.lease_token < OLD.lease_token
           OR (NEW.lease_owner IS NOT NULL
               AND (OLD.lease_owner IS NULL
                    OR NEW.lease_owner <> OLD.lease_owner
                    OR NEW.lease_acquired_at <> OLD.lease_acquired_at)
               AND NEW.lease_token <= OLD.lease_token) THEN
            RAISE EXCEPTION 'agentdb: lease token of % must grow with every new lease (% -> %)',
                    TG_TABLE_NAME, OLD.lease_token, NEW.lease_token
                USING ERRCODE = 'AG005', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    ELSE
        IF NEW.task_id IS DISTINCT FROM OLD.task_id
           OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
           OR NEW.action IS DISTINCT FROM OLD.action THEN
            RAISE EXCEPTION 'agentdb: the task, idempotency key and action of % are bound to its key', TG_TABLE_NAME
                USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    END IF;
    IF NEW.state_version = OLD.state_version + 1 THEN
        RETURN NEW;
    END IF;
    -- Same version: allowed only if nothing but the heartbeat columns changed
    -- (an UPDATE that changes nothing at all included).
    IF NEW.state_version = OLD.state_version THEN
        probe := NEW;
        probe.updated_at := OLD.updated_at;
        IF TG_ARGV[0] = 'task' THEN
            probe.lease_expires_at := OLD.lease_expires_at;
        END IF;
        IF probe IS NOT DISTINCT FROM OLD THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'agentdb: % state_version must move by exactly +1 (% -> %)',
            TG_TABLE_NAME, OLD.state_version, NEW.state_version
        USING ERRCODE = 'AG002', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

-- G6
CREATE TRIGGER agent_tasks_transition_guard
    BEFORE INSERT OR UPDATE OF state ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_transition('task');
-- G7, G2, G4, G12: one rule each (AG002, AG004, AG008, AG005).
CREATE TRIGGER agent_tasks_version_guard
    BEFORE INSERT OR UPDATE ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_version('task');
-- A hint no guarantee rests on: a new task wakes idle workers.
CREATE TRIGGER agent_tasks_notify
    AFTER INSERT ON agent_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_notify('agentdb_tasks');

-- G18: per-tenant (task_type '*') and per-task-type caps on running tasks.
-- max_running NULL means unlimited; 0 pauses the tenant (or the type).
-- A cap is configuration, not history: the deletion policy (G17) deletes it.
CREATE TABLE agent_concurrency_limits (
    tenant_id   uuid        NOT NULL,
    task_type   text        NOT NULL DEFAULT '*',
    max_running integer,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_concurrency_limits_pkey PRIMARY KEY (tenant_id, task_type),
    -- G2: a cap names a tenant; RESTRICT, deletion follows G17's routine.
    CONSTRAINT agent_concurrency_limits_tenant_fkey FOREIGN KEY (tenant_id)
        REFERENCES agent_tenants (id),
    -- G18
    CONSTRAINT agent_concurrency_limits_max_running_valid CHECK (max_running >= 0),
    CONSTRAINT agent_concurrency_limits_task_type_valid CHECK (length(task_type) BETWEEN 1 AND 200)
);

-- G18: how many of a tenant's tasks run now ('*': of every type). VOLATILE
-- on purpose: called from the claim it counts with a fresh snapshot, so it
-- sees tasks another claimer committed after the claim statement began (a
-- PL/pgSQL query in a VOLATILE function takes a new snapshot). PL/pgSQL for
-- the reason agentdb_current_tenant is: the claim and the cap guard call it
-- in every claim.
CREATE FUNCTION agentdb_running_count(p_tenant uuid, p_task_type text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM agent_tasks t
    WHERE t.tenant_id = p_tenant AND t.state = 'running'
      AND (p_task_type = '*' OR t.task_type = p_task_type);
    RETURN n;
END
$$;

-- G18: refuse a move into 'running' that takes a tenant (or a task type of
-- it) over its cap. Locks the caps it checks, so two writers cannot both
-- take the last slot; the claim holds those locks already and never waits.
CREATE FUNCTION agentdb_guard_concurrency() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    cap record;
    running bigint;
BEGIN
    FOR cap IN
        SELECT l.task_type, l.max_running
        FROM agent_concurrency_limits l
        WHERE l.tenant_id = NEW.tenant_id AND l.task_type IN ('*', NEW.task_type)
          AND l.max_running IS NOT NULL
        ORDER BY l.task_type
        FOR UPDATE
    LOOP
        running := agentdb_running_count(NEW.tenant_id, cap.task_type);
        IF running > cap.max_running THEN
            RAISE EXCEPTION 'agentdb: tenant % would run % task(s) of type %, over its limit of %',
                    NEW.tenant_id, running, cap.task_type, cap.max_running
                USING ERRCODE = 'AG009', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- G18: every way into 'running' is an UPDATE (G6 has no edge from '(new)').
CREATE TRIGGER agent_tasks_concurrency_guard
    AFTER UPDATE OF state ON agent_tasks
    FOR EACH ROW WHEN (NEW.state = 'running' AND OLD.state <> 'running')
    EXECUTE FUNCTION agentdb_guard_concurrency();

REVOKE EXECUTE ON FUNCTION agentdb_running_count(uuid, text) FROM PUBLIC;

CALL agentdb_pin_search_paths();
