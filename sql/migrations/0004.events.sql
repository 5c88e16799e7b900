-- 0004 events: the append-only audit trail (G8) with redacted, bounded
-- payloads and a retention separate from the skeleton (G9).
-- depends: 0003.operations
-- phase: expand
--
-- The article's INSERT names tenant_id, task_id, event_type, actor_id,
-- policy_version and payload; those columns keep their meaning. The version
-- columns tie an event to the state change it records: the deferred
-- constraint triggers at the end refuse to commit a task or operation state
-- change that has no event (G8), so no writer - runtime, migration script or
-- hand-typed SQL - can change state silently.
--
-- Every state change writes an event, so the event insert is on every write
-- path and the table carries no index it does not need: each unique key
-- below is also the lookup of its task's (operation's) events, and the
-- secret check calls its function only for a payload its regex matches.
-- Events by month (opt-in, `agentdb migrate --events-by-month`) are in
-- 0011.retention.

CREATE SEQUENCE agent_events_id_seq AS bigint;

CREATE TABLE agent_events (
    -- A sequence-backed bigint, not an identity column: Citus cannot
    -- reshard tables with identity columns.
    id                      bigint      NOT NULL DEFAULT nextval('agent_events_id_seq'),
    tenant_id               uuid        NOT NULL,
    task_id                 uuid        NOT NULL,
    operation_id            uuid,
    event_type              text        NOT NULL,
    actor_id                text        NOT NULL,
    policy_version          text        NOT NULL,
    from_state              text,
    to_state                text,
    -- G8: the task / operation state_version this event records, if any.
    task_state_version      bigint,
    operation_state_version bigint,
    -- G9: redacted facts or references only; NULL once the payload retention
    -- has passed (the skeleton above stays until retain_until).
    payload                 jsonb                DEFAULT '{}',
    trace_id                text,
    span_id                 text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    payload_expires_at      timestamptz NOT NULL DEFAULT now() + interval '30 days',
    retain_until            timestamptz NOT NULL DEFAULT now() + interval '400 days',
    CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id),
    -- G2
    CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    CONSTRAINT agent_events_operation_fkey FOREIGN KEY (tenant_id, operation_id)
        REFERENCES agent_operations (tenant_id, id),
    -- G5
    CONSTRAINT agent_events_event_type_valid CHECK (length(event_type) BETWEEN 1 AND 200),
    CONSTRAINT agent_events_actor_id_valid CHECK (length(actor_id) BETWEEN 1 AND 200),
    CONSTRAINT agent_events_policy_version_valid CHECK (length(policy_version) BETWEEN 1 AND 100),
    CONSTRAINT agent_events_state_valid CHECK (length(from_state) <= 50 AND length(to_state) <= 50),
    CONSTRAINT agent_events_operation_version_has_operation
        CHECK (operation_state_version IS NULL OR operation_id IS NOT NULL),
    -- G9: bounded, redacted payload; retention of the payload ends first. The
    -- secret check runs agentdb_jsonb_has_secrets's own first step (its
    -- regex) inline and calls the function only for a payload that matches:
    -- the call itself (a PL/pgSQL frame, its pinned search_path) costs more
    -- than the regex, and most payloads never match (tests/test_events_diet.py
    -- keeps the two regexes equal).
    CONSTRAINT agent_events_payload_size
        CHECK (jsonb_typeof(payload) = 'object' AND octet_length(payload::text) <= 8192),
    CONSTRAINT agent_events_payload_no_secrets
        CHECK (payload::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)'
               OR NOT agentdb_jsonb_has_secrets(payload)),
    CONSTRAINT agent_events_retention_order CHECK (payload_expires_at <= retain_until),
    -- G16
    CONSTRAINT agent_events_trace_id_format
        CHECK (trace_id ~ '^[0-9a-f]{32}$' AND trace_id <> '00000000000000000000000000000000'),
    CONSTRAINT agent_events_span_id_format
        CHECK (span_id ~ '^[0-9a-f]{16}$' AND span_id <> '0000000000000000')
);

ALTER SEQUENCE agent_events_id_seq OWNED BY agent_events.id;

-- G8: at most one event per recorded state_version (NULL versions are
-- distinct: an event that records none is not counted); also the lookup of
-- a task's events - the deferred event check, the foreign-key checks of a
-- task's delete, a task's events in order (a small sort), a child's
-- finishing event.
CREATE UNIQUE INDEX agent_events_task_version_key
    ON agent_events (tenant_id, task_id, task_state_version);
-- G8: the same per operation; also the operation's event lookup (retention,
-- tenant deletion).
CREATE UNIQUE INDEX agent_events_operation_version_key
    ON agent_events (tenant_id, operation_id, operation_state_version)
    WHERE operation_id IS NOT NULL;
-- G9: the retention paths.
CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
-- G9
CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
    WHERE payload IS NOT NULL;

-- G8: the audit log is append-only. UPDATE may only erase a payload (set it
-- to NULL, nothing else changing) - redaction removes data, it never rewrites
-- history. DELETE is refused until the row's retain_until has passed; only
-- roles granted DELETE (the owner, through the retention routine) get that far.
CREATE FUNCTION agentdb_guard_append_only() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    probe record;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'agentdb: % is append-only; TRUNCATE is refused', TG_TABLE_NAME
            USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    ELSIF TG_OP = 'DELETE' THEN
        IF OLD.retain_until <= now() THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'agentdb: % row % is retained until %', TG_TABLE_NAME, OLD.id, OLD.retain_until
            USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    probe := NEW;
    probe.payload := OLD.payload;
    IF NEW.payload IS NULL AND probe IS NOT DISTINCT FROM OLD THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'agentdb: % is append-only; only erasing a payload is allowed', TG_TABLE_NAME
        USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

-- G8
CREATE TRIGGER agent_events_append_only
    BEFORE UPDATE OR DELETE ON agent_events
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
-- G8
CREATE TRIGGER agent_events_no_truncate
    BEFORE TRUNCATE ON agent_events
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

-- G8: every state_version a task or operation reaches has its event, written
-- in the same transaction. Checked at commit, so the state write and the
-- event insert may come in either order (or in one statement).
CREATE FUNCTION agentdb_require_event() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.id
          AND e.task_state_version = NEW.state_version;
    ELSE
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.id
          AND e.operation_state_version = NEW.state_version;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agentdb: % % reached state_version % (%) without an event',
                TG_ARGV[0], NEW.id, NEW.state_version, NEW.state
            USING ERRCODE = 'AG006', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G8
CREATE CONSTRAINT TRIGGER agent_tasks_event_required
    AFTER INSERT OR UPDATE ON agent_tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('task');
-- G8
CREATE CONSTRAINT TRIGGER agent_operations_event_required
    AFTER INSERT OR UPDATE ON agent_operations
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('operation');

CALL agentdb_pin_search_paths();
