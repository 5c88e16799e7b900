-- 0003 operations: one external or internal effect a task attempts (G1),
-- reserved and committed before the provider is called (G13).
-- depends: 0002.tasks
-- phase: expand
--
-- The article's agent_operations columns, plus state_version (G7), attempts,
-- error and trace linkage (G16). 'unknown' is the state of an operation whose
-- provider call may have happened before a crash: it must be reconciled, never
-- blindly re-run.

CREATE TABLE agent_operations (
    id                 uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id          uuid        NOT NULL,
    task_id            uuid        NOT NULL,
    idempotency_key    text        NOT NULL,
    action             text        NOT NULL,
    -- G4: sha256 (hex) of the canonical encoding of the operation's input.
    input_hash         text        NOT NULL,
    state              text        NOT NULL DEFAULT 'reserved',
    state_version      bigint      NOT NULL DEFAULT 0,
    provider_reference text,
    result             jsonb,
    error              text,
    attempts           integer     NOT NULL DEFAULT 1,
    trace_id           text,
    span_id            text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_operations_pkey PRIMARY KEY (tenant_id, id),
    -- G2: an operation can only belong to a task of its own tenant.
    CONSTRAINT agent_operations_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    -- G3: two workers cannot create the same logical operation twice.
    CONSTRAINT agent_operations_idempotency_key UNIQUE (tenant_id, idempotency_key),
    -- G5
    CONSTRAINT agent_operations_state_valid
        CHECK (state IN ('reserved', 'in_flight', 'succeeded', 'failed', 'unknown')),
    CONSTRAINT agent_operations_state_version_valid CHECK (state_version >= 0),
    CONSTRAINT agent_operations_idempotency_key_valid CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT agent_operations_action_valid CHECK (length(action) BETWEEN 1 AND 200),
    -- G4: the key's request hash is a sha256 hex digest.
    CONSTRAINT agent_operations_input_hash_format CHECK (input_hash ~ '^[0-9a-f]{64}$'),
    -- G5
    CONSTRAINT agent_operations_attempts_valid CHECK (attempts >= 1),
    CONSTRAINT agent_operations_provider_reference_valid CHECK (length(provider_reference) BETWEEN 1 AND 500),
    CONSTRAINT agent_operations_error_valid CHECK (length(error) <= 4000),
    CONSTRAINT agent_operations_succeeded_has_no_error CHECK (state <> 'succeeded' OR error IS NULL),
    -- G9: a stored result is a bounded fragment, never a whole provider response.
    CONSTRAINT agent_operations_result_valid CHECK (octet_length(result::text) <= 65536),
    -- G16
    CONSTRAINT agent_operations_trace_id_format
        CHECK (trace_id ~ '^[0-9a-f]{32}$' AND trace_id <> '00000000000000000000000000000000'),
    CONSTRAINT agent_operations_span_id_format
        CHECK (span_id ~ '^[0-9a-f]{16}$' AND span_id <> '0000000000000000')
);

-- Serves the composite FK from tasks and "operations of this task".
CREATE INDEX agent_operations_task_idx ON agent_operations (tenant_id, task_id);
-- Recovery path: operations that need reconciling.
CREATE INDEX agent_operations_unsettled_idx ON agent_operations (updated_at)
    WHERE state IN ('reserved', 'in_flight', 'unknown');

-- G6
CREATE TRIGGER agent_operations_transition_guard
    BEFORE INSERT OR UPDATE OF state ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_transition('operation');
-- G7, G2, G4: one rule each (AG002, AG004, AG008 from 0011 on).
CREATE TRIGGER agent_operations_version_guard
    BEFORE INSERT OR UPDATE ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_version('operation');
