-- 0003 operations: one external or internal effect a task attempts (G1),
-- reserved and committed before the provider is called (G13); what a task
-- produced (artifacts) and how it reaches a provider (credential references).
-- depends: 0002.tasks
-- phase: expand
--
-- The article's agent_operations columns, plus state_version (G7), attempts,
-- error and trace linkage (G16). 'unknown' is the state of an operation whose
-- provider call may have happened before a crash: it must be reconciled, never
-- blindly re-run.
--
-- Artifacts are references (a URI into blob storage plus its digest), never
-- the bytes. Credential rows are references into a secret manager, never the
-- secret: the CHECKs refuse a value that is not a URI or that looks like a key.
-- Both are owned by a tenant (G2) and covered by the tenant deletion policy
-- (G17).

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

-- G2: serves the composite FK from tasks and "operations of this task".
CREATE INDEX agent_operations_task_idx ON agent_operations (tenant_id, task_id);
-- G13: the recovery path: operations that need reconciling.
CREATE INDEX agent_operations_unsettled_idx ON agent_operations (updated_at)
    WHERE state IN ('reserved', 'in_flight', 'unknown');
-- G9: the retention path (agentdb_purge 'operations', 0011.retention).
CREATE INDEX agent_operations_settled_idx ON agent_operations (updated_at)
    WHERE state IN ('succeeded', 'failed');

-- G6
CREATE TRIGGER agent_operations_transition_guard
    BEFORE INSERT OR UPDATE OF state ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_transition('operation');
-- G7, G2, G4: one rule each (AG002, AG004, AG008).
CREATE TRIGGER agent_operations_version_guard
    BEFORE INSERT OR UPDATE ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_version('operation');

CREATE TABLE agent_artifacts (
    id           uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id    uuid        NOT NULL,
    task_id      uuid,
    operation_id uuid,
    kind         text        NOT NULL,
    uri          text        NOT NULL,
    sha256       text,
    size_bytes   bigint,
    content_type text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    retain_until timestamptz,
    CONSTRAINT agent_artifacts_pkey PRIMARY KEY (tenant_id, id),
    -- G2
    CONSTRAINT agent_artifacts_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    CONSTRAINT agent_artifacts_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    CONSTRAINT agent_artifacts_operation_fkey FOREIGN KEY (tenant_id, operation_id)
        REFERENCES agent_operations (tenant_id, id),
    -- G5
    CONSTRAINT agent_artifacts_kind_valid CHECK (length(kind) BETWEEN 1 AND 100),
    CONSTRAINT agent_artifacts_uri_valid
        CHECK (length(uri) <= 2000 AND uri ~ '^[a-z][a-z0-9+.-]*://[^[:space:]]+$'),
    CONSTRAINT agent_artifacts_sha256_format CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT agent_artifacts_size_valid CHECK (size_bytes >= 0),
    CONSTRAINT agent_artifacts_content_type_valid CHECK (length(content_type) BETWEEN 1 AND 200)
);

-- G2: serve the composite FKs (and the purge's "nothing refers to it").
CREATE INDEX agent_artifacts_task_idx ON agent_artifacts (tenant_id, task_id)
    WHERE task_id IS NOT NULL;
CREATE INDEX agent_artifacts_operation_idx ON agent_artifacts (tenant_id, operation_id)
    WHERE operation_id IS NOT NULL;

CREATE TABLE agent_credential_refs (
    id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id  uuid        NOT NULL,
    name       text        NOT NULL,
    provider   text        NOT NULL,
    -- e.g. vault://kv/acme/openai, aws-sm://arn..., env://OPENAI_API_KEY
    secret_ref text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    rotated_at timestamptz,
    CONSTRAINT agent_credential_refs_pkey PRIMARY KEY (tenant_id, id),
    CONSTRAINT agent_credential_refs_name_key UNIQUE (tenant_id, name),
    -- G2
    CONSTRAINT agent_credential_refs_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    -- G5
    CONSTRAINT agent_credential_refs_name_valid CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT agent_credential_refs_provider_valid CHECK (length(provider) BETWEEN 1 AND 100),
    -- G17: a reference, never a secret value.
    CONSTRAINT agent_credential_refs_is_reference CHECK (
        length(secret_ref) <= 500
        AND secret_ref ~ '^[a-z][a-z0-9+.-]*://[^[:space:]]+$'
        AND NOT agentdb_is_secret_value(secret_ref))
);
