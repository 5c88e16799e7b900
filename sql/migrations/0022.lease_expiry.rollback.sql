-- Back to 0021: the expiry index of the running tasks (WHERE state = 'running'),
-- tenant-leading where the schema is distributed, and agentdb_distribute() as
-- 0021.delegated_writes defined it.

DO $$
DECLARE
    tenant_leading boolean := pg_get_indexdef('agent_tasks_lease_expiry_idx'::regclass)
                                  LIKE '%(tenant_id, lease_expires_at)%';
BEGIN
    DROP INDEX agent_tasks_lease_expiry_idx;
    IF tenant_leading THEN
        CREATE INDEX agent_tasks_lease_expiry_idx ON agent_tasks (tenant_id, lease_expires_at)
            WHERE state = 'running';
    ELSE
        CREATE INDEX agent_tasks_lease_expiry_idx ON agent_tasks (lease_expires_at)
            WHERE state = 'running';
    END IF;
END
$$;

-- Distribute the schema (see 0012.citus's header). Owner only.
--
-- An installation that already holds rows (one moving to Citus):
-- create_distributed_table copies a table's rows into its new shards, and
-- the shards' triggers fire on that copy, on the workers: where the tables
-- those triggers read (agent_transitions, agent_concurrency_limits,
-- agent_rate_limits, ...) may not be distributed yet - the distribution
-- failed with XX000 "relation ... does not exist" - and where they would
-- check again rows they already passed when written (a signal's guard
-- refused the copy of a finished task's signal: "task ... is succeeded; it
-- takes no more signals"). So agentdb's enabled row-level insert triggers on
-- the tables not yet distributed are disabled for the whole distribution and
-- enabled again, on the distributed tables and all their shards, before it
-- commits. It is one transaction holding the tables locked: no writer ever
-- runs while they are off. A trigger someone had disabled stays disabled;
-- one the distribution drops (the NOTIFY hints) stays dropped. Events by
-- month are paused on the partitioned table itself, first: the walk over
-- plain tables would reach the partitions, and Citus cannot enable a
-- partition's clone of a trigger again by its name on the shards (42704
-- "trigger ..._102232 does not exist"). Paused on the parent, the clones are
-- paused with it, the walk passes them by (it skips disabled triggers), and
-- one ENABLE on the parent covers every partition.
CREATE OR REPLACE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    tbl text;
    r record;
    rels text[] := '{}';
    names text[] := '{}';
    i integer;
    paused text[] := '{}';
    name text;
    events_distributed boolean;
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

    -- Events by month: the partitioned table's row-level insert triggers
    -- (TRIGGER_TYPE_ROW 1, INSERT 4), paused on the parent.
    SELECT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_events'::regclass) INTO events_distributed;
    IF NOT events_distributed
       AND (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        FOR name IN
            SELECT t.tgname FROM pg_trigger t
            WHERE t.tgrelid = 'agent_events'::regclass AND NOT t.tgisinternal
              AND t.tgenabled <> 'D' AND t.tgtype & 5 = 5
            ORDER BY t.tgname
        LOOP
            EXECUTE format('ALTER TABLE agent_events DISABLE TRIGGER %I', name);
            paused := paused || name;
        END LOOP;
    END IF;
    -- Every other table not yet distributed: its row-level insert triggers
    -- only (the copy fires nothing else, and Citus does not carry ENABLE of a
    -- TRUNCATE trigger to the shards).
    FOR r IN
        SELECT c.oid::regclass::text AS rel, t.tgname
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relname LIKE 'agent\_%' AND c.relkind = 'r'
          AND NOT t.tgisinternal AND t.tgenabled <> 'D'
          AND t.tgtype & 5 = 5
          AND NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = c.oid)
          -- A reference table's shard on the coordinator is listed too
          -- once shards are visible (citus.override_table_visibility).
          AND NOT relation_is_a_known_shard(c.oid)
        ORDER BY c.relname, t.tgname
    LOOP
        EXECUTE format('ALTER TABLE %s DISABLE TRIGGER %I', r.rel, r.tgname);
        rels := rels || r.rel;
        names := names || r.tgname::text;
    END LOOP;

    -- G19: no global rate limits on a distributed schema.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint c
                   WHERE c.conrelid = 'agent_global_rate_limits'::regclass
                     AND c.conname = 'agent_global_rate_limits_local_only') THEN
        IF EXISTS (SELECT 1 FROM agent_global_rate_limits) THEN
            RAISE EXCEPTION 'agentdb: global rate limits cannot be kept on Citus'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'delete the agent_global_rate_limits rows and set them per tenant (agent_rate_limits)';
        END IF;
        ALTER TABLE agent_global_rate_limits
            ADD CONSTRAINT agent_global_rate_limits_local_only CHECK (false);
    END IF;

    -- One transaction that touches many shards: sequential, so a failure
    -- part-way leaves nothing distributed; triggers stay on the tables.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);

    -- Issue 40: the per-tenant statements on tenant-leading indexes. On one
    -- node the claim and the relay find expired leases and due messages
    -- across tenants (lease_claim, outbox_claim), by time alone; on Citus each
    -- shard holds many tenants and every statement names one (routed_claim,
    -- routed_outbox_claim, and the discovery's probe per tenant), so the
    -- time-only index read the other tenants' rows of the shard. Redefined
    -- here under the same names, before the tables are distributed (their
    -- shards copy the definition) or on the distributed tables (Citus carries
    -- the DDL to every shard).
    IF pg_get_indexdef('agent_tasks_lease_expiry_idx'::regclass) NOT LIKE '%(tenant_id, lease_expires_at)%' THEN
        DROP INDEX agent_tasks_lease_expiry_idx;
        CREATE INDEX agent_tasks_lease_expiry_idx ON agent_tasks (tenant_id, lease_expires_at)
            WHERE state = 'running';
    END IF;
    IF pg_get_indexdef('agent_outbox_pending_idx'::regclass) NOT LIKE '%(tenant_id, next_attempt_at)%' THEN
        DROP INDEX agent_outbox_pending_idx;
        CREATE INDEX agent_outbox_pending_idx ON agent_outbox (tenant_id, next_attempt_at)
            WHERE state = 'pending';
    END IF;

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

    -- G2: tenant names. Citus cannot keep agent_tenants_name_key (a
    -- distributed table's unique constraint must hold its distribution
    -- column, id), so the names move to agent_tenant_names: a reference
    -- table keyed by the name, filled from agent_tenants here. The routed
    -- create claims its name there first, then inserts the tenant, in one
    -- transaction (agentdb._citus.routed.create_tenant). No foreign key
    -- (Citus has none from a reference table to a distributed one): a name
    -- whose tenant was deleted is taken over by the next create of it.
    IF to_regclass('agent_tenant_names') IS NULL THEN
        CREATE TABLE agent_tenant_names (
            name      text NOT NULL CONSTRAINT agent_tenant_names_pkey PRIMARY KEY,
            tenant_id uuid NOT NULL
        );
        INSERT INTO agent_tenant_names (name, tenant_id) SELECT t.name, t.id FROM agent_tenants t;
        PERFORM create_reference_table('agent_tenant_names');
    END IF;
    IF EXISTS (SELECT 1 FROM pg_constraint c
               WHERE c.conrelid = 'agent_tenants'::regclass
                 AND c.conname = 'agent_tenants_name_key') THEN
        ALTER TABLE agent_tenants DROP CONSTRAINT agent_tenants_name_key;
    END IF;

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

    -- G19: the budget tables; the rate-limit trigger updates agent_rate_limits
    -- from inside a shard's insert.
    FOREACH tbl IN ARRAY ARRAY['agent_budgets', 'agent_budget_holds', 'agent_rate_limits']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = tbl::regclass) THEN
            PERFORM create_distributed_table(tbl, 'tenant_id', colocate_with => 'agent_tenants');
        END IF;
    END LOOP;
    ALTER FUNCTION agentdb_count_call() SET citus.allow_nested_distributed_execution = on;

    -- G20, G21: the guard of new and re-armed operations reads their task.
    ALTER FUNCTION agentdb_guard_open_task() SET citus.allow_nested_distributed_execution = on;

    -- G22: the signals (their NOTIFY hint dropped, as the others'); their
    -- triggers and the task's cursor guard read the other table.
    IF EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = 'agent_signals'::regclass
                                            AND g.tgname = 'agent_signals_notify') THEN
        DROP TRIGGER agent_signals_notify ON agent_signals;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_signals'::regclass) THEN
        PERFORM create_distributed_table('agent_signals', 'tenant_id', colocate_with => 'agent_tenants');
    END IF;
    ALTER FUNCTION agentdb_signal_access() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_signal() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_deliver_signal() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_signal_cursor() SET citus.allow_nested_distributed_execution = on;

    -- G23: the fan-in reads and wakes the parent, always on the child's own
    -- shard (same tenant).
    ALTER FUNCTION agentdb_guard_child() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_fan_in() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_children_wait() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_children_done(uuid, uuid) SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_keep_parent() SET citus.allow_nested_distributed_execution = on;

    -- G24: the schedules; the tick guard reads a task's schedule.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_schedules'::regclass) THEN
        PERFORM create_distributed_table('agent_schedules', 'tenant_id', colocate_with => 'agent_tenants');
    END IF;
    ALTER FUNCTION agentdb_guard_schedule_tick() SET citus.allow_nested_distributed_execution = on;

    FOR i IN 1 .. coalesce(array_length(rels, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger t
                   WHERE t.tgrelid = rels[i]::regclass AND t.tgname = names[i]) THEN
            EXECUTE format('ALTER TABLE %s ENABLE TRIGGER %I', rels[i], names[i]);
        END IF;
    END LOOP;

    -- G25: the steps. Copying the rows of an installation into their shards is
    -- no write of a handler's: the guard (a finished task records no step) is
    -- paused for it, as the others are above. Their guard and the outbox's
    -- read the task's colocated shard.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p
                   WHERE p.logicalrelid = 'agent_steps'::regclass) THEN
        ALTER TABLE agent_steps DISABLE TRIGGER agent_steps_guard;
        PERFORM create_distributed_table('agent_steps', 'tenant_id', colocate_with => 'agent_tenants');
        ALTER TABLE agent_steps ENABLE TRIGGER agent_steps_guard;
    END IF;
    ALTER FUNCTION agentdb_guard_step() SET citus.allow_nested_distributed_execution = on;
    ALTER FUNCTION agentdb_guard_outbox_task() SET citus.allow_nested_distributed_execution = on;

    -- The routed claim and transition (0021.delegated_writes), distributed by
    -- their tenant argument and colocated with agent_tenants: Citus sends a
    -- call made outside a transaction block whole to the node that holds the
    -- tenant's shards, and it runs and commits there.
    PERFORM create_distributed_function(
        'agentdb_routed_claim(uuid, text, bigint, interval, text[])', '$1',
        colocate_with => 'agent_tenants');
    PERFORM create_distributed_function(
        'agentdb_routed_transition(uuid, uuid, bigint, text, boolean, text, timestamptz, text,'
        ' text, bigint, text, text, jsonb, uuid[], text[], jsonb[], text, text, text, bigint,'
        ' integer)', '$1', colocate_with => 'agent_tenants');

    FOREACH name IN ARRAY paused LOOP
        EXECUTE format('ALTER TABLE agent_events ENABLE TRIGGER %I', name);
    END LOOP;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0021.delegated_writes'::text $$;

CALL agentdb_pin_search_paths();
