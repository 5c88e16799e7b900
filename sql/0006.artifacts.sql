-- 0006 artifacts and credential references: what a task produced, and how it
-- reaches a provider, both owned by a tenant (G2) and covered by the tenant
-- deletion policy (G17).
-- depends: 0005.outbox
-- phase: expand
--
-- Artifacts are references (a URI into blob storage plus its digest), never
-- the bytes. Credential rows are references into a secret manager, never the
-- secret: the CHECKs refuse a value that is not a URI or that looks like a key.

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
