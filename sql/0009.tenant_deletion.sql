-- 0009 tenant deletion: the explicit, tested policy for a tenant's data (G17).
-- depends: 0008.notify
-- phase: expand
--
-- agentdb_delete_tenant(tenant, dry_run, actor) applies this policy, in order,
-- and returns one row per step with the rows it touched (or, with dry_run,
-- would touch - each step counts with the same predicate it acts on):
--
--   tenants            mark 'deleting'; the row goes when nothing else remains
--   principals         delete the pins: the tenant's agent logins see nothing
--   credential_refs    delete; refs = the secret references to revoke in the
--                      secret manager (the database never held the secrets)
--   artifacts          delete; refs = the blob URIs for the caller to purge
--   inbox, outbox      delete (undelivered messages are dropped, not sent)
--   tasks              cancel unfinished ones, anonymise params / step / error
--   operations         anonymise result and error (provider references stay:
--                      they are what a refund or dispute needs)
--   events             erase every payload now; the audit skeleton is retained
--                      until its retain_until, then deleted - the append-only
--                      guard (G8) refuses earlier deletion, by design
--   operations, tasks  delete once no retained event refers to them
--
-- Anonymising is a state write like any other: it moves state_version and
-- writes its event (G7, G8). Only rows that are kept (some event about them
-- is still under retention) are anonymised; the rest are deleted outright.
-- The anonymisation events inherit the retention of the row's existing
-- events, so deleting never extends how long a tenant is kept.
-- Running it again does only what became possible since (a no-op right
-- away; the final deletion once retention has passed).

CREATE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
    anonymised bigint := 0;  -- events steps 7 and 8 write (or would write)
    r text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;

    -- 1. tenants: mark deleting
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t WHERE t.id = p_tenant AND t.state <> 'deleting';
    ELSE
        UPDATE agent_tenants t SET state = 'deleting', updated_at = now()
        WHERE t.id = p_tenant AND t.state <> 'deleting';
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 1, 'agent_tenants', 'mark deleting', n, NULL::timestamptz, NULL::text[];

    -- 2. principals
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_principals p WHERE p.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_principals p WHERE p.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 2, 'agent_principals', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 3. credential references
    SELECT coalesce(array_agg(c.secret_ref ORDER BY c.secret_ref), '{}') INTO r
    FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 3, 'agent_credential_refs', 'delete (revoke refs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 4. artifacts
    SELECT coalesce(array_agg(a.uri ORDER BY a.uri), '{}') INTO r
    FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 4, 'agent_artifacts', 'delete (purge blobs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 5. inbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_inbox i WHERE i.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_inbox i WHERE i.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 5, 'agent_inbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 6. outbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_outbox o WHERE o.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_outbox o WHERE o.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 6, 'agent_outbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 7. tasks: cancel and anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant
          AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
               OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                      AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_tasks t
            SET state = CASE WHEN t.state IN ('pending', 'waiting', 'running') THEN 'cancelled'
                             ELSE t.state END,
                state_version = t.state_version + 1,
                params = '{}', last_error = NULL, current_step = NULL,
                lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                updated_at = now()
            WHERE t.tenant_id = p_tenant
              AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
                   OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                          AND e.task_id = t.id AND e.retain_until > now())
            RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                      to_state, task_state_version, payload, payload_expires_at,
                                      retain_until)
            SELECT u.tenant_id, u.id, 'task.anonymised', p_actor, u.workflow_version, u.state,
                   u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            CROSS JOIN LATERAL (
                SELECT coalesce(max(e.retain_until), now()) AS until FROM agent_events e
                WHERE e.tenant_id = u.tenant_id AND e.task_id = u.id) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 7, 'agent_tasks', 'cancel and anonymise', n, NULL::timestamptz, NULL::text[];

    -- 8. operations: anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                      AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_operations o
            SET result = NULL, error = NULL, state_version = o.state_version + 1, updated_at = now()
            WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                          AND e.operation_id = o.id AND e.retain_until > now())
            RETURNING o.tenant_id, o.id, o.task_id, o.state, o.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                                      policy_version, to_state, operation_state_version, payload,
                                      payload_expires_at, retain_until)
            SELECT u.tenant_id, u.task_id, u.id, 'operation.anonymised', p_actor, 'tenant-deletion',
                   u.state, u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            CROSS JOIN LATERAL (
                SELECT coalesce(max(e.retain_until), now()) AS until FROM agent_events e
                WHERE e.tenant_id = u.tenant_id AND e.operation_id = u.id) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 8, 'agent_operations', 'anonymise', n, NULL::timestamptz, NULL::text[];

    -- 9. events: erase payloads now (the one UPDATE the append-only guard allows)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
    ELSE
        UPDATE agent_events e SET payload = NULL
        WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 9, 'agent_events', 'erase payloads', n, NULL::timestamptz, NULL::text[];

    -- 10. events past their retention
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
    ELSE
        DELETE FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 10, 'agent_events', 'delete (retention passed)', n, NULL::timestamptz, NULL::text[];

    -- 11. events still under retention: kept for audit (a dry run adds the
    -- anonymisation events a real run would have written by now)
    SELECT count(*), max(e.retain_until) INTO n, retained_until
    FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until > now();
    IF p_dry_run THEN
        n := n + anonymised;
    END IF;
    RETURN QUERY SELECT 11, 'agent_events', 'retain for audit', n, retained_until, NULL::text[];

    -- 12. operations no retained event refers to
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
              AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id AND e.operation_id = o.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 12, 'agent_operations', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 13. tasks no retained event refers to (their operations, outbox rows and
    -- artifacts are gone by now)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
              AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 13, 'agent_tasks', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 14. the tenant itself, once nothing of it is retained
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (SELECT 1 FROM agent_tasks k WHERE k.tenant_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 14, 'agent_tenants', 'delete', n, NULL::timestamptz, NULL::text[];
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;

CALL agentdb_pin_search_paths();
