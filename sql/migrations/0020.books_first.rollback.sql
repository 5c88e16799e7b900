-- Back to 0019: the purges as 0011.retention defined them.

-- G9, G17: the tasks class. A finished task is taken only once nothing
-- refers to it any more - no event, operation, outbox row, artifact, signal
-- (the 'signals' class goes first), step or child (a parent stays while its
-- children do, so a batch never picks a parent whose child it leaves
-- behind). What only belongs to it goes first, by the same rules: its own
-- budgets (agentdb_purge_books) and its steps. A step is never written for a
-- finished task (agent_steps_guard), so none appears after.
CREATE OR REPLACE FUNCTION agentdb_purge_tasks(p_tenant uuid, p_batch integer, p_older_than interval)
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
    PERFORM agentdb_purge_books(p_tenant, 'tasks', p_batch, p_older_than);
    -- Two statements each, not one with "p_tenant IS NULL OR": on Citus the
    -- tenant's must name it to route to its worker.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE k.tenant_id = s.tenant_id AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id);
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
                 AND NOT EXISTS (SELECT 1 FROM agent_signals s
                                 WHERE s.tenant_id = k.tenant_id AND s.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_steps st
                                 WHERE st.tenant_id = k.tenant_id AND st.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                                 WHERE c.tenant_id = k.tenant_id AND c.parent_id = k.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE t.tenant_id = v.tenant_id AND t.id = v.id;
    ELSE
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE s.tenant_id = p_tenant AND k.tenant_id = p_tenant AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = p_tenant AND op.task_id = k.id);
        WITH v AS MATERIALIZED (
            SELECT k.id FROM agent_tasks k
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_operations op
                              WHERE op.tenant_id = p_tenant AND op.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                              WHERE ob.tenant_id = p_tenant AND ob.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_signals s
                              WHERE s.tenant_id = p_tenant AND s.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_steps st
                              WHERE st.tenant_id = p_tenant AND st.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                              WHERE c.tenant_id = p_tenant AND c.parent_id = k.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9: retention, every tenant (see the header). Events are taken by their
-- whole primary key (tenant_id, id, created_at): by month an id is unique
-- only with its created_at, and by (tenant_id, id) alone a row inserted with
-- a copied id (anyone who may INSERT events may name one) would be taken
-- along with the expired row it copies - and a retained one refused by the
-- append-only guard, failing the whole batch.
CREATE OR REPLACE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(NULL, p_batch, p_older_than);
    ELSIF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(NULL, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    CASE p_kind
    WHEN 'event_payloads' THEN
        UPDATE agent_events e SET payload = NULL
        FROM (SELECT tenant_id, id, created_at FROM agent_events
              WHERE payload IS NOT NULL AND payload_expires_at <= now()
              LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        DELETE FROM agent_events e
        USING (SELECT tenant_id, id, created_at FROM agent_events WHERE retain_until <= now()
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
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
        PERFORM agentdb_purge_books(NULL, p_kind, p_batch, p_older_than);
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
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9: retention, one tenant (see the header).
CREATE OR REPLACE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(p_tenant, p_batch, p_older_than);
    ELSIF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(p_tenant, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    CASE p_kind
    WHEN 'event_payloads' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND payload IS NOT NULL AND payload_expires_at <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        UPDATE agent_events e SET payload = NULL FROM v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND retain_until <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_events e USING v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'outbox_delivered' THEN
        WITH v AS MATERIALIZED (
            SELECT id FROM agent_outbox
            WHERE tenant_id = p_tenant AND state = 'delivered'
              AND delivered_at <= now() - p_older_than
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_outbox o USING v WHERE o.tenant_id = p_tenant AND o.id = v.id;
    WHEN 'inbox' THEN
        WITH v AS MATERIALIZED (
            SELECT consumer, message_id FROM agent_inbox
            WHERE tenant_id = p_tenant AND processed_at <= now() - p_older_than
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_inbox i USING v
        WHERE i.tenant_id = p_tenant AND i.consumer = v.consumer AND i.message_id = v.message_id;
    WHEN 'operations' THEN
        PERFORM agentdb_purge_books(p_tenant, p_kind, p_batch, p_older_than);
        WITH v AS MATERIALIZED (
            SELECT op.id FROM agent_operations op
            WHERE op.tenant_id = p_tenant AND op.state IN ('succeeded', 'failed')
              AND op.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.operation_id = op.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.operation_id = op.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_operations o USING v WHERE o.tenant_id = p_tenant AND o.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0019.ticks_from_the_anchor'::text $$;

CALL agentdb_pin_search_paths();
