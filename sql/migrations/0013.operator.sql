-- 0013 operator: what an operator's console and command line need (issue 39).
-- depends: 0012.citus
-- phase: expand
--
-- * Tenant names are unique (agent_tenants_name_key, G2): create_tenant
--   with a name that is taken answers with that tenant, and a tenant can be
--   looked up by its name. A database that already holds two tenants of one
--   name is refused, naming them, before anything changes: which of the two
--   keeps the name is the operator's call.
-- * A failed or dead task may go back to pending (G6: two new edges in
--   agent_transitions): the operator's retry, one versioned write with its
--   event (task.retried, the actor named). Cancelled and succeeded stay final.
-- * A third role, agentdb_operator (G15): what a human operator's console
--   connects as - one tenant per transaction by row-level security, never
--   the owner. agentdb_grant_roles() is redefined whole to create it and
--   grant to it; without CREATEROLE it says so as for the other two.

DO $$
DECLARE
    dup text;
BEGIN
    SELECT string_agg(format('%L (%s tenants)', name, n), ', ') INTO dup
    FROM (SELECT name, count(*) AS n FROM agent_tenants GROUP BY name HAVING count(*) > 1) d;
    IF dup IS NOT NULL THEN
        RAISE EXCEPTION 'agentdb: tenant names must be unique now, and these are not: %', dup
            USING ERRCODE = 'unique_violation', HINT = 'rename all but one of each, then migrate again';
    END IF;
END
$$;

-- G2: one tenant per name, so a name finds one tenant and a retried create
-- answers with the tenant it made. On a schema Citus distributes already the
-- constraint cannot be on agent_tenants (a distributed table's unique
-- constraint must hold its distribution column, id): agentdb_distribute(),
-- called below, keeps the names in agent_tenant_names instead.
DO $$
BEGIN
    IF NOT agentdb_distributed() THEN
        ALTER TABLE agent_tenants ADD CONSTRAINT agent_tenants_name_key UNIQUE (name);
    END IF;
END
$$;

-- G6: the operator's retry. Only from failed or dead: a cancel is final
-- (G20), and a success has nothing to retry.
INSERT INTO agent_transitions (entity, from_state, to_state) VALUES
    ('task', 'failed', 'pending'),
    ('task', 'dead',   'pending');

-- G21: past its deadline a task only ends - and a retry is no way round it.
-- The guard is redefined whole to see the two edges above: it fired only for
-- an unfinished task (OLD.state pending, waiting or running), so a failed or
-- dead task past its deadline went back to pending unchecked.
DROP TRIGGER agent_tasks_deadline_guard ON agent_tasks;
CREATE TRIGGER agent_tasks_deadline_guard
    BEFORE UPDATE ON agent_tasks
    FOR EACH ROW WHEN (OLD.deadline_at IS NOT NULL
                       AND (OLD.state IN ('pending', 'waiting', 'running') OR NEW.state = 'pending'))
    EXECUTE FUNCTION agentdb_guard_deadline();

-- G15: the roles, agentdb_operator with them. Idempotent, as in 0010.access.
CREATE OR REPLACE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
DECLARE
    may_create boolean;
    saved_level text := current_setting('client_min_messages');
    scope text := '(SELECT agentdb_current_tenant())';
    tbl text;
BEGIN
    SELECT r.rolsuper OR r.rolcreaterole INTO may_create
    FROM pg_roles r WHERE r.rolname = current_user;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        scope := 'agentdb_current_tenant()';
    END IF;

    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        IF may_create THEN
            CREATE ROLE agentdb_runtime NOLOGIN;
        ELSE
            RAISE NOTICE 'agentdb: role agentdb_runtime is missing and % may not create roles; '
                'have a DBA run CREATE ROLE agentdb_runtime NOLOGIN, then CALL agentdb_grant_roles()', current_user;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        IF may_create THEN
            CREATE ROLE agentdb_agent NOLOGIN;
        ELSE
            RAISE NOTICE 'agentdb: role agentdb_agent is missing and % may not create roles; '
                'have a DBA run CREATE ROLE agentdb_agent NOLOGIN, then CALL agentdb_grant_roles()', current_user;
        END IF;
    END IF;

    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_operator') THEN
        IF may_create THEN
            CREATE ROLE agentdb_operator NOLOGIN;
        ELSE
            RAISE NOTICE 'agentdb: role agentdb_operator is missing and % may not create roles; '
                'have a DBA run CREATE ROLE agentdb_operator NOLOGIN, then CALL agentdb_grant_roles()', current_user;
        END IF;
    END IF;

    -- Re-running drops and recreates the policies; their "does not exist"
    -- notices on the first run are noise.
    PERFORM set_config('client_min_messages', 'warning', true);

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        -- The schema's name is only known now; %I quotes it.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_runtime', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_credential_refs TO agentdb_runtime;
        GRANT SELECT, INSERT, UPDATE ON agent_tasks, agent_operations, agent_outbox TO agentdb_runtime;
        -- G18: the claim locks the caps it applies (FOR UPDATE needs UPDATE);
        -- no DELETE: max_running NULL lifts a cap.
        GRANT SELECT, INSERT, UPDATE ON agent_concurrency_limits TO agentdb_runtime;
        -- G8: the runtime appends to the audit log and never rewrites it.
        GRANT SELECT, INSERT ON agent_events, agent_inbox, agent_artifacts TO agentdb_runtime;
        GRANT USAGE ON SEQUENCE agent_events_id_seq TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_running_count(uuid, text) TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_runtime;
        -- G22: the runtime sends and reads signals (cross-tenant, as it claims).
        GRANT SELECT, INSERT ON agent_signals TO agentdb_runtime;
        -- G24: it creates, pauses and fires schedules, and deletes none.
        GRANT SELECT, INSERT, UPDATE ON agent_schedules TO agentdb_runtime;
        GRANT EXECUTE ON FUNCTION agentdb_fire_schedule(uuid, uuid) TO agentdb_runtime;
        -- G25: it records and reads the steps of the tasks it holds.
        GRANT SELECT, INSERT, UPDATE ON agent_steps TO agentdb_runtime;
        -- G19: it holds and settles (UPDATE) and may set budgets and limits
        -- (INSERT, UPDATE); it never deletes them.
        GRANT SELECT, INSERT, UPDATE ON agent_budgets, agent_budget_holds, agent_rate_limits,
                                        agent_global_rate_limits TO agentdb_runtime;

        FOREACH tbl IN ARRAY ARRAY['agent_tenants', 'agent_tasks', 'agent_operations', 'agent_events',
                                   'agent_outbox', 'agent_inbox', 'agent_artifacts',
                                   'agent_credential_refs', 'agent_concurrency_limits',
                                   'agent_signals', 'agent_schedules', 'agent_steps',
                                   'agent_budgets', 'agent_budget_holds', 'agent_rate_limits']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_runtime_all', tbl);
            EXECUTE format('CREATE POLICY %I ON %I TO agentdb_runtime USING (true) WITH CHECK (true)',
                           tbl || '_runtime_all', tbl);
        END LOOP;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_agent') THEN
        -- G15: read-only, own tenant only; writes go through agentdb_request_task.
        -- No access to the caps, budgets or schedules: they are the operator's.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_agent', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_tasks, agent_operations,
                        agent_events, agent_artifacts TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_agent;
        GRANT EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) TO agentdb_agent;

        DROP POLICY IF EXISTS agent_tenants_agent_scope ON agent_tenants;
        EXECUTE format('CREATE POLICY agent_tenants_agent_scope ON agent_tenants FOR SELECT '
                       'TO agentdb_agent USING (id = %s)', scope);
        FOREACH tbl IN ARRAY ARRAY['agent_tasks', 'agent_operations', 'agent_events', 'agent_artifacts']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_agent_scope', tbl);
            EXECUTE format('CREATE POLICY %I ON %I FOR SELECT TO agentdb_agent USING (tenant_id = %s)',
                           tbl || '_agent_scope', tbl, scope);
        END LOOP;

        -- G15, G22: an agent reads its own tenant's signals and sends plain
        -- signals to them - never an approval (an agent does not approve its
        -- own work).
        GRANT SELECT, INSERT ON agent_signals TO agentdb_agent;
        DROP POLICY IF EXISTS agent_signals_agent_scope ON agent_signals;
        CREATE POLICY agent_signals_agent_scope ON agent_signals FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
        DROP POLICY IF EXISTS agent_signals_agent_send ON agent_signals;
        CREATE POLICY agent_signals_agent_send ON agent_signals FOR INSERT TO agentdb_agent
            WITH CHECK (tenant_id = agentdb_current_tenant() AND kind = 'signal');
        -- G15, G25: it reads its own tenant's steps and writes none (a step is
        -- written under a lease it never holds).
        GRANT SELECT ON agent_steps TO agentdb_agent;
        DROP POLICY IF EXISTS agent_steps_agent_scope ON agent_steps;
        CREATE POLICY agent_steps_agent_scope ON agent_steps FOR SELECT TO agentdb_agent
            USING (tenant_id = agentdb_current_tenant());
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_operator') THEN
        -- G15: a human operator's console, one tenant per transaction: the
        -- tenant it scopes to (SET LOCAL agentdb.tenant_id, or the pin of its
        -- login in agent_principals) is the only one whose rows it sees or
        -- writes. It reads what an operator looks at and makes the writes an
        -- operator makes - cancel or retry a task (UPDATE agent_tasks with
        -- its event), approve or signal (INSERT agent_signals: G22's guard
        -- still refuses an approver who held the task's lease), settle an
        -- unknown effect (UPDATE agent_operations and its budget holds),
        -- retry a dead message (UPDATE agent_outbox). It creates no task or
        -- operation, deletes nothing and rewrites no event.
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentdb_operator', current_schema());
        GRANT SELECT ON agent_tenants, agent_transitions, agent_steps, agent_concurrency_limits
            TO agentdb_operator;
        GRANT SELECT, UPDATE ON agent_tasks, agent_operations, agent_outbox, agent_budgets,
                                agent_budget_holds TO agentdb_operator;
        -- A cancel is the library's task_transition, which writes a move's outbox
        -- messages in the same statement - none for a cancel, but Postgres asks
        -- for the privilege of every table a statement names. The messages of a
        -- finished task are refused (agent_outbox_for_open_task) as for anyone.
        GRANT INSERT ON agent_outbox TO agentdb_operator;
        GRANT SELECT, INSERT ON agent_events, agent_signals TO agentdb_operator;
        GRANT USAGE ON SEQUENCE agent_events_id_seq TO agentdb_operator;
        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_operator;

        DROP POLICY IF EXISTS agent_tenants_operator_scope ON agent_tenants;
        EXECUTE format('CREATE POLICY agent_tenants_operator_scope ON agent_tenants FOR SELECT '
                       'TO agentdb_operator USING (id = %s)', scope);
        FOREACH tbl IN ARRAY ARRAY['agent_tasks', 'agent_operations', 'agent_events', 'agent_outbox',
                                   'agent_signals', 'agent_steps', 'agent_budgets',
                                   'agent_budget_holds', 'agent_concurrency_limits']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_operator_scope', tbl);
            EXECUTE format('CREATE POLICY %I ON %I TO agentdb_operator '
                           'USING (tenant_id = %s) WITH CHECK (tenant_id = %s)',
                           tbl || '_operator_scope', tbl, scope, scope);
        END LOOP;
    END IF;

    PERFORM set_config('client_min_messages', saved_level, true);
END
$$;



REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

-- agentdb_distribute() redefined whole (0012.citus's, with the tenant
-- names above): a schema it distributes keeps its names unique in
-- agent_tenant_names. See 0012.citus for the rest of its story.
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

    FOREACH name IN ARRAY paused LOOP
        EXECUTE format('ALTER TABLE agent_events ENABLE TRIGGER %I', name);
    END LOOP;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0013.operator'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();

-- On an install that is distributed already: the names move to
-- agent_tenant_names (see above); nothing else is left to distribute.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute();
    END IF;
END
$$;
