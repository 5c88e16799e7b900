-- 0005 delivery: the outbox (G10) and the consumers' inbox (G11).
-- depends: 0004.events
-- phase: expand
--
-- An outbox row is written in the same transaction as the state change it
-- announces, so a crash between commit and publish loses nothing: the relay
-- finds the row still pending. The relay may publish a row twice (it can
-- crash after publishing, before marking it delivered), so the id is a
-- stable message id and consumers record it in agent_inbox.

CREATE TABLE agent_outbox (
    -- G11: stable message id, passed to the publisher as its idempotency key.
    id              uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id       uuid        NOT NULL,
    task_id         uuid,
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}',
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL DEFAULT 20,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- The relay claims a row by taking a lease (owner + token) and pushing
    -- next_attempt_at out, then publishes outside any transaction; marking it
    -- delivered is fenced by the token.
    lease_owner     text,
    lease_token     bigint      NOT NULL DEFAULT 0,
    delivered_at    timestamptz,
    last_error      text,
    trace_id        text,
    span_id         text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_outbox_pkey PRIMARY KEY (tenant_id, id),
    -- G2
    CONSTRAINT agent_outbox_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    CONSTRAINT agent_outbox_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    -- G5
    CONSTRAINT agent_outbox_state_valid CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT agent_outbox_topic_valid CHECK (length(topic) BETWEEN 1 AND 200),
    CONSTRAINT agent_outbox_attempts_valid CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT agent_outbox_delivered_at_valid CHECK ((state = 'delivered') = (delivered_at IS NOT NULL)),
    CONSTRAINT agent_outbox_lease_owner_valid CHECK (length(lease_owner) BETWEEN 1 AND 200),
    CONSTRAINT agent_outbox_lease_token_valid CHECK (lease_token >= 0),
    CONSTRAINT agent_outbox_last_error_valid CHECK (length(last_error) <= 4000),
    -- G9
    CONSTRAINT agent_outbox_payload_size
        CHECK (jsonb_typeof(payload) = 'object' AND octet_length(payload::text) <= 65536),
    -- G16
    CONSTRAINT agent_outbox_trace_id_format
        CHECK (trace_id ~ '^[0-9a-f]{32}$' AND trace_id <> '00000000000000000000000000000000'),
    CONSTRAINT agent_outbox_span_id_format
        CHECK (span_id ~ '^[0-9a-f]{16}$' AND span_id <> '0000000000000000')
);

-- G10: the relay path: only pending rows are indexed.
CREATE INDEX agent_outbox_pending_idx ON agent_outbox (next_attempt_at)
    WHERE state = 'pending';
-- G10: the retention path for delivered rows.
CREATE INDEX agent_outbox_delivered_idx ON agent_outbox (delivered_at)
    WHERE state = 'delivered';
-- G10: dead messages need an operator (agentdb status); found without a scan.
CREATE INDEX agent_outbox_dead_idx ON agent_outbox (tenant_id)
    WHERE state = 'dead';
-- G2: serves the composite FK from tasks.
CREATE INDEX agent_outbox_task_idx ON agent_outbox (tenant_id, task_id)
    WHERE task_id IS NOT NULL;

-- G6
CREATE TRIGGER agent_outbox_transition_guard
    BEFORE INSERT OR UPDATE OF state ON agent_outbox
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_transition('outbox');
-- A hint no guarantee rests on: a new outbox row wakes idle relays.
CREATE TRIGGER agent_outbox_notify
    AFTER INSERT ON agent_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_notify('agentdb_outbox');

-- G11: a consumer records each message id it has processed, in the same
-- transaction as its own effect; a redelivery then hits the primary key.
CREATE TABLE agent_inbox (
    tenant_id    uuid        NOT NULL,
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_inbox_pkey PRIMARY KEY (tenant_id, consumer, message_id),
    CONSTRAINT agent_inbox_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    CONSTRAINT agent_inbox_consumer_valid CHECK (length(consumer) BETWEEN 1 AND 200)
);

-- G11: the retention path (keep the inbox longer than any redelivery can take).
CREATE INDEX agent_inbox_processed_at_idx ON agent_inbox (processed_at);
