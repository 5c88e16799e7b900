-- 0010 retention and telemetry settings (G9, G16).
-- depends: 0009.tenant_deletion
-- phase: expand
--
-- agentdb_purge(kind, batch, older_than) removes at most `batch` rows of one
-- retention class per call and returns how many it removed. Each call is its
-- own short statement: `agentdb purge` calls it until it returns less than a
-- batch, so no lock is held for long, an interrupted purge simply resumes,
-- and live traffic keeps its SKIP LOCKED claims (purge skips locked rows too).
--
--   event_payloads     erase payloads past payload_expires_at (the one UPDATE
--                      the append-only guard allows)
--   events             delete audit events past retain_until (the guard allows
--                      exactly these)
--   outbox_delivered   delete delivered outbox rows older than `older_than`
--   inbox              delete inbox rows older than `older_than` (keep it longer
--                      than any redelivery can take)
--   operations         delete settled operations older than `older_than` that
--                      no event or artifact refers to (an operation is the
--                      idempotency ledger: it lives as long as its audit trail)
--   tasks              delete finished tasks older than `older_than` with no
--                      remaining events, operations, outbox rows or artifacts
--
-- Owner only by default; GRANT EXECUTE to a maintenance role to delegate.

CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    CASE p_kind
    WHEN 'event_payloads' THEN
        UPDATE agent_events e SET payload = NULL
        FROM (SELECT tenant_id, id FROM agent_events
              WHERE payload IS NOT NULL AND payload_expires_at <= now()
              LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id;
    WHEN 'events' THEN
        DELETE FROM agent_events e
        USING (SELECT tenant_id, id FROM agent_events WHERE retain_until <= now()
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id;
    WHEN 'outbox_delivered' THEN
        DELETE FROM agent_outbox o
        USING (SELECT tenant_id, id FROM agent_outbox
               WHERE state = 'delivered' AND delivered_at <= now() - p_older_than
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE o.tenant_id = v.tenant_id AND o.id = v.id;
    WHEN 'inbox' THEN
        DELETE FROM agent_inbox i
        USING (SELECT tenant_id, consumer, message_id FROM agent_inbox
               WHERE processed_at <= now() - p_older_than
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE i.tenant_id = v.tenant_id AND i.consumer = v.consumer
          AND i.message_id = v.message_id;
    WHEN 'operations' THEN
        DELETE FROM agent_operations o
        USING (SELECT op.tenant_id, op.id FROM agent_operations op
               WHERE op.state IN ('succeeded', 'failed')
                 AND op.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = op.tenant_id AND e.operation_id = op.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = op.tenant_id AND a.operation_id = op.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE o.tenant_id = v.tenant_id AND o.id = v.id;
    WHEN 'tasks' THEN
        DELETE FROM agent_tasks t
        USING (SELECT k.tenant_id, k.id FROM agent_tasks k
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_operations op
                                 WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                                 WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE t.tenant_id = v.tenant_id AND t.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;

-- Indexes the purge paths need (the others exist since 0004 / 0005).
CREATE INDEX agent_operations_settled_idx ON agent_operations (updated_at)
    WHERE state IN ('succeeded', 'failed');
CREATE INDEX agent_events_operation_idx ON agent_events (tenant_id, operation_id)
    WHERE operation_id IS NOT NULL;
CREATE INDEX agent_tasks_finished_idx ON agent_tasks (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled', 'dead');
-- agentdb status: dead messages need an operator; find them without a scan.
CREATE INDEX agent_outbox_dead_idx ON agent_outbox (tenant_id)
    WHERE state = 'dead';

-- G16: which version of the OpenTelemetry GenAI semantic conventions the
-- application's spans followed, and since when. The spec is still evolving
-- and renames attributes; a reader of an old trace id looks up the version in
-- effect at the row's created_at. Append-only: a new pin is a new row.
-- Written by the owner at deploy time (agentdb.telemetry.pin_semconv).
CREATE TABLE agent_semconv_pins (
    since      timestamptz NOT NULL DEFAULT clock_timestamp(),
    version    text        NOT NULL,
    pinned_by  text        NOT NULL DEFAULT current_user,
    CONSTRAINT agent_semconv_pins_pkey PRIMARY KEY (since),
    CONSTRAINT agent_semconv_pins_version_format
        CHECK (version ~ '^[0-9]+\.[0-9]+(\.[0-9]+)?([-+][0-9A-Za-z.-]+)?$')
);

-- G16: history is only appended to; a wrong pin is corrected by a newer one.
CREATE FUNCTION agentdb_refuse_change() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'agentdb: % is append-only', TG_TABLE_NAME
        USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

CREATE TRIGGER agent_semconv_pins_append_only
    BEFORE UPDATE OR DELETE ON agent_semconv_pins
    FOR EACH ROW EXECUTE FUNCTION agentdb_refuse_change();

CALL agentdb_pin_search_paths();
