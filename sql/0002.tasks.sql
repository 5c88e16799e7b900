-- 0002 tasks: the user-level workflow (G1), with its lease (G12), version
-- (G7), dedupe key (G3) and trace linkage (G16).
-- depends: 0001.foundation
-- phase: expand
--
-- The article's agent_tasks columns are all here, unchanged in meaning. The
-- primary key leads with tenant_id (the article's UNIQUE (tenant_id, id)) so
-- every child can reference (tenant_id, id) and Citus can distribute by tenant.

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
        CHECK (span_id ~ '^[0-9a-f]{16}$' AND span_id <> '0000000000000000')
);

-- Claim path: only due-able rows are in the index, so it stays small however
-- many finished tasks the table holds.
CREATE INDEX agent_tasks_due_idx ON agent_tasks (wake_at)
    WHERE state IN ('pending', 'waiting');
-- Recovery path: running tasks whose lease ran out.
CREATE INDEX agent_tasks_lease_expiry_idx ON agent_tasks (lease_expires_at)
    WHERE state = 'running';

-- G6
CREATE TRIGGER agent_tasks_transition_guard
    BEFORE INSERT OR UPDATE OF state ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_transition('task');
-- G7, G2, G4, G12: one rule each (AG002, AG004, AG008 from 0011 on, AG005).
CREATE TRIGGER agent_tasks_version_guard
    BEFORE INSERT OR UPDATE ON agent_tasks
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_version('task');
