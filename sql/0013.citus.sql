-- 0013 citus: the step that distributes the schema on a Citus coordinator.
-- depends: 0012.fair_claim
-- phase: expand
--
-- Nothing here changes a plain Postgres: it only creates two routines.
-- `agentdb migrate --citus` applies every migration (the tables are then
-- plain tables on the coordinator) and then calls agentdb_distribute(),
-- which turns them into Citus tables in one transaction:
--
--   * every tenant table is distributed by its tenant column, all in the
--     colocation group of agent_tenants, so one tenant's rows of every
--     table live on one worker and a tenant's statement routes to one node
--     and commits there without two-phase commit;
--   * the small shared tables (agent_principals, agent_transitions,
--     agent_semconv_pins) become reference tables, copied to every node;
--   * agent_principals_tenant_fkey is dropped: Citus has no foreign key
--     from a reference table to a distributed one. What it guarded (a login
--     pinned to a tenant that exists) is checked by agentdb_current_tenant's
--     callers: a pin to a missing tenant sees no row, as before;
--   * the NOTIFY triggers are dropped: on Citus they fire on a worker, where
--     no coordinator listener hears them, and a NOTIFY makes the worker
--     refuse PREPARE TRANSACTION. Workers and relays poll on Citus;
--   * functions that read another table from inside a shard's statement
--     (the tenant scope of the agent policies, the caps guard) may run a
--     nested query: citus.allow_nested_distributed_execution on them. Their
--     nested statement is always for the same tenant, so it is on the same
--     worker's colocated shard and runs in the same transaction.
--
-- Every step checks what is already done, so the procedure may be called
-- again after an interruption or after a later migration.

-- Whether this schema's tables are distributed by Citus (false on plain
-- Postgres, where pg_dist_partition does not exist and is never read).
CREATE FUNCTION agentdb_distributed() RETURNS boolean
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition p
        WHERE p.logicalrelid = 'agent_tasks'::regclass
    );
END
$$;

-- G15: scope the current transaction to one tenant (tenancy.tenant_scope).
-- A SET LOCAL statement, not set_config(): Citus sends SET statements on to
-- the workers' shard connections (with citus.propagate_set_commands =
-- 'local'), where the agent policies read the setting; set_config() stays
-- on the coordinator and the workers' policies would see no tenant. Anyone
-- may call it: it sets nothing a session could not set itself.
CREATE FUNCTION agentdb_scope_tenant(p_tenant uuid) RETURNS uuid
    LANGUAGE plpgsql
AS $$
BEGIN
    IF p_tenant IS NULL THEN
        RAISE EXCEPTION 'agentdb: tenant scope needs a tenant id' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        SET LOCAL citus.propagate_set_commands = 'local';
    END IF;
    EXECUTE format('SET LOCAL agentdb.tenant_id = %L', p_tenant);
    RETURN p_tenant;
END
$$;

-- G9: agentdb_purge (0010) for one tenant. On Citus every statement names
-- the tenant, so each routes to the tenant's worker (agentdb_purge's
-- cross-tenant FOR UPDATE is refused there); the retention classes, their
-- order and the batch bound are agentdb_purge's. The victims are picked in a
-- MATERIALIZED CTE so a batch is never exceeded.
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
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
        WITH v AS MATERIALIZED (
            SELECT id FROM agent_events
            WHERE tenant_id = p_tenant AND payload IS NOT NULL AND payload_expires_at <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        UPDATE agent_events e SET payload = NULL FROM v
        WHERE e.tenant_id = p_tenant AND e.id = v.id;
    WHEN 'events' THEN
        WITH v AS MATERIALIZED (
            SELECT id FROM agent_events WHERE tenant_id = p_tenant AND retain_until <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_events e USING v WHERE e.tenant_id = p_tenant AND e.id = v.id;
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
    WHEN 'tasks' THEN
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
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;

CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    tbl text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'agentdb: the citus extension is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'CREATE EXTENSION citus on the coordinator and every worker first';
    END IF;
    IF p_shard_count IS NULL OR p_shard_count < 1 THEN
        RAISE EXCEPTION 'agentdb: shard count must be a positive integer, not %', p_shard_count
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One transaction that touches many shards: sequential, so a failure
    -- part-way leaves nothing distributed; triggers stay on the tables.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);

    IF EXISTS (SELECT 1 FROM pg_trigger g
               WHERE g.tgrelid = 'agent_tasks'::regclass AND g.tgname = 'agent_tasks_notify') THEN
        DROP TRIGGER agent_tasks_notify ON agent_tasks;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger g
               WHERE g.tgrelid = 'agent_outbox'::regclass AND g.tgname = 'agent_outbox_notify') THEN
        DROP TRIGGER agent_outbox_notify ON agent_outbox;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_constraint c
               WHERE c.conrelid = 'agent_principals'::regclass
                 AND c.conname = 'agent_principals_tenant_fkey') THEN
        ALTER TABLE agent_principals DROP CONSTRAINT agent_principals_tenant_fkey;
    END IF;
    -- The agent policies without (SELECT ...): Citus refuses sub-selects
    -- in a distributed table's policy, and grant_roles writes that form
    -- when the citus extension is present.
    CALL agentdb_grant_roles();

    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = 'agent_tenants'::regclass) THEN
        PERFORM create_distributed_table('agent_tenants', 'id', shard_count => p_shard_count);
    END IF;
    -- Parents before children: a foreign key needs its target distributed.
    FOREACH tbl IN ARRAY ARRAY['agent_tasks', 'agent_operations', 'agent_events', 'agent_outbox',
                               'agent_inbox', 'agent_artifacts', 'agent_credential_refs',
                               'agent_concurrency_limits']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = tbl::regclass) THEN
            PERFORM create_distributed_table(tbl, 'tenant_id', colocate_with => 'agent_tenants');
        END IF;
    END LOOP;
    FOREACH tbl IN ARRAY ARRAY['agent_principals', 'agent_transitions', 'agent_semconv_pins']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = tbl::regclass) THEN
            PERFORM create_reference_table(tbl);
            IF tbl = 'agent_transitions' THEN
                -- Its seed rows were copied to every node; the coordinator's
                -- local copy is no longer read.
                PERFORM truncate_local_data_after_distributing_table(tbl::regclass);
            END IF;
        END IF;
    END LOOP;

    ALTER FUNCTION agentdb_current_tenant() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_concurrency() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_running_count(uuid, text) SET citus.allow_nested_distributed_execution = on;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;

-- The newest migration this schema has; replaced by every later migration.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0013.citus'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
