-- 0021 delegated writes: on Citus a claim of one tenant and a transition run
-- whole on the tenant's node (issue 40).
-- depends: 0020.books_first
-- phase: expand
--
-- * agentdb_routed_claim() and agentdb_routed_transition(): the routed claim
--   of one tenant (G18, G12) and the routed transition (G7, G12, G22, G23),
--   each with the events (G8) and messages (G10) it writes, as one function.
--   Sent as statements, each was planned on the coordinator and again, from
--   its deparsed text, on the worker - four remote commands and four round
--   trips a claim or a finish, most of Citus's CPU per task. A function
--   distributed by its tenant argument is sent whole to the tenant's node
--   (Citus's function call delegation), runs there on the local shards with
--   its plans cached, and commits there.
-- * Their statements are the ones agentdb/_citus/queries/routed.sql held
--   (routed_claim, routed_transition), unchanged but for their parameters:
--   tests/test_routed_twins.py holds them against their single-node twins
--   as it held those. The plain runtime never calls them; on a plain schema
--   they are ordinary functions (the routed forms run there in tests).
-- * agentdb_distribute() redefined whole (0014.citus_scale's, with one more
--   step): it distributes the two functions by their tenant, colocated with
--   agent_tenants. On an install that is distributed already, it runs now.

-- G18, G12, G8: lease up to $3 of tenant $1's due tasks to worker $2 and
-- write each claim's event (task.claimed, or task.reclaimed for an expired
-- lease taken over), in the order the claim takes them (ord). The statement
-- is routed_claim's of 0014-0020 (see agentdb/_citus/queries/routed.sql):
-- running tasks whose lease expired first, then pending/waiting ones in
-- wake_at order, never beyond the tenant's caps; the caps are locked FOR
-- UPDATE SKIP LOCKED and a claimer that finds any held takes no new task.
-- Zero rows: nothing of this tenant is due that this worker may take, or its
-- caps are full or held by another claimer. A cap another writer filled after
-- the statement's snapshot is refused by agent_tasks_concurrency_guard
-- (AG009): the function, and everything it wrote, rolls back.
CREATE FUNCTION agentdb_routed_claim(p_tenant_id uuid, p_lease_owner text, p_batch bigint,
                                     p_lease_ttl interval, p_task_types text[])
    RETURNS TABLE (id uuid, tenant_id uuid, task_type text, workflow_version text, state text,
                   state_version bigint, current_step text, wake_at timestamptz,
                   dedupe_key text, input_hash text, params jsonb, attempts integer,
                   max_attempts integer, last_error text, lease_ttl interval,
                   lease_owner text, lease_token bigint, lease_acquired_at timestamptz,
                   lease_expires_at timestamptz, deadline_at timestamptz, trace_id text,
                   span_id text, created_at timestamptz, updated_at timestamptz,
                   from_state text, ord bigint)
    LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    FOR id, tenant_id, task_type, workflow_version, state, state_version, current_step, wake_at,
        dedupe_key, input_hash, params, attempts, max_attempts, last_error, lease_ttl,
        lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at, trace_id,
        span_id, created_at, updated_at, from_state, ord IN
    WITH caps AS MATERIALIZED (
        SELECT l.task_type, l.max_running
        FROM agent_concurrency_limits l
        WHERE l.tenant_id = $1 AND l.max_running IS NOT NULL
        ORDER BY l.task_type
        FOR UPDATE SKIP LOCKED
    ), free AS MATERIALIZED (
        SELECT c.task_type,
               c.max_running - (SELECT count(*) FROM agent_tasks r
                                WHERE r.tenant_id = $1 AND r.state = 'running'
                                  AND (c.task_type = '*' OR r.task_type = c.task_type)) AS slots
        FROM caps c
    ), open AS MATERIALIZED (
        SELECT (SELECT count(*) FROM caps) = (
                   SELECT count(*) FROM agent_concurrency_limits l
                   WHERE l.tenant_id = $1 AND l.max_running IS NOT NULL)
               AND coalesce((SELECT f.slots FROM free f WHERE f.task_type = '*'), 1) > 0 AS ok
    ), expired AS MATERIALIZED (
        SELECT t.id, t.state AS from_state
        FROM agent_tasks t
        WHERE t.tenant_id = $1 AND t.state = 'running' AND t.lease_expires_at <= now()
          AND t.attempts < t.max_attempts AND ($5::text[] IS NULL OR t.task_type = ANY ($5))
          AND (t.deadline_at IS NULL OR t.deadline_at > now())
        ORDER BY t.lease_expires_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ), fresh AS MATERIALIZED (
        SELECT t.id, t.state AS from_state, t.task_type, t.wake_at
        FROM agent_tasks t
        WHERE t.tenant_id = $1 AND t.state IN ('pending', 'waiting') AND t.wake_at <= now()
          AND t.attempts < t.max_attempts AND ($5::text[] IS NULL OR t.task_type = ANY ($5))
          AND (t.deadline_at IS NULL OR t.deadline_at > now())
          AND (SELECT o.ok FROM open o)
          AND NOT EXISTS (SELECT 1 FROM free f WHERE f.task_type = t.task_type AND f.slots <= 0)
        ORDER BY t.wake_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ), by_type AS (
        SELECT f.id, f.from_state, f.task_type, f.wake_at,
               row_number() OVER (PARTITION BY f.task_type ORDER BY f.wake_at, f.id) AS nth
        FROM fresh f
    ), allowed AS (
        SELECT b.id, b.from_state, row_number() OVER (ORDER BY b.wake_at, b.id) AS nth
        FROM by_type b
        WHERE b.nth <= coalesce((SELECT f.slots FROM free f WHERE f.task_type = b.task_type), b.nth)
    ), picked AS (
        SELECT p.id, p.from_state, p.ord
        FROM ((SELECT e.id, e.from_state, 0::int8 AS ord FROM expired e)
              UNION ALL
              (SELECT a.id, a.from_state, a.nth FROM allowed a
               WHERE a.nth <= coalesce((SELECT f.slots FROM free f WHERE f.task_type = '*'), a.nth))) p
        ORDER BY p.ord
        LIMIT $3
    )
    UPDATE agent_tasks t
    SET state = 'running',
        state_version = t.state_version + 1,
        lease_owner = $2,
        lease_token = t.lease_token + 1,
        lease_acquired_at = now(),
        lease_expires_at = now() + coalesce($4, t.lease_ttl),
        attempts = t.attempts + 1,
        updated_at = now()
    FROM picked p
    WHERE t.tenant_id = $1 AND t.id = p.id
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id,
              t.created_at, t.updated_at, p.from_state, p.ord
    LOOP
        -- One single-row INSERT per claim: Citus routes it to the shard beside
        -- the task's (an INSERT ... SELECT it would plan through the node, as
        -- a COPY that row-level security refuses).
        INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                  from_state, to_state, task_state_version, payload, trace_id,
                                  span_id)
        VALUES (p_tenant_id, agentdb_routed_claim.id,
                CASE WHEN agentdb_routed_claim.from_state = 'running'
                     THEN 'task.reclaimed' ELSE 'task.claimed' END,
                agentdb_routed_claim.lease_owner, agentdb_routed_claim.workflow_version,
                agentdb_routed_claim.from_state, agentdb_routed_claim.state,
                agentdb_routed_claim.state_version,
                jsonb_build_object('lease_token', agentdb_routed_claim.lease_token,
                                   'attempt', agentdb_routed_claim.attempts),
                agentdb_routed_claim.trace_id, agentdb_routed_claim.span_id);
        RETURN NEXT;
    END LOOP;
END
$$;

-- G7, G12, G22, G23, G8, G10: move tenant $1's task $2 if it is still at
-- version $3 and, for a lease holder, under the caller's lease, with its
-- event and its outbox messages. The parameters, and the row returned, are
-- task_transition's (agentdb/queries/tasks.sql); the UPDATE is
-- routed_transition's of 0014-0020 (Citus refuses now() inside CASE or
-- COALESCE, so "now" is read once, in prior). Zero rows: the task is gone,
-- another writer moved state_version on, or the caller's lease was taken
-- over; nothing was written.
CREATE FUNCTION agentdb_routed_transition(
    p_tenant_id uuid, p_id uuid, p_expected_version bigint, p_to_state text, p_set_step boolean,
    p_current_step text, p_wake_at timestamptz, p_last_error text, p_lease_owner text,
    p_lease_token bigint, p_event_type text, p_actor_id text, p_payload jsonb,
    p_outbox_ids uuid[], p_outbox_topics text[], p_outbox_payloads jsonb[], p_trace_id text,
    p_span_id text, p_wait_signal text, p_signal_cursor bigint, p_wait_children integer)
    RETURNS TABLE (id uuid, tenant_id uuid, task_type text, workflow_version text, state text,
                   state_version bigint, current_step text, wake_at timestamptz,
                   dedupe_key text, input_hash text, params jsonb, attempts integer,
                   max_attempts integer, last_error text, lease_ttl interval,
                   lease_owner text, lease_token bigint, lease_acquired_at timestamptz,
                   lease_expires_at timestamptz, deadline_at timestamptz, trace_id text,
                   span_id text, created_at timestamptz, updated_at timestamptz)
    LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_from text;
    v_trace text;
    v_span text;
BEGIN
    FOR id, tenant_id, task_type, workflow_version, state, state_version, current_step, wake_at,
        dedupe_key, input_hash, params, attempts, max_attempts, last_error, lease_ttl,
        lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at, trace_id,
        span_id, created_at, updated_at, v_from IN
    WITH prior AS MATERIALIZED (
        SELECT state, now() AS at FROM agent_tasks WHERE tenant_id = $1 AND id = $2
    )
    UPDATE agent_tasks t
    SET state = $4,
        state_version = t.state_version + 1,
        current_step = CASE WHEN $5 THEN $6 ELSE t.current_step END,
        wake_at = CASE
            WHEN $4 IN ('pending', 'waiting')
                THEN coalesce($7, CASE WHEN $4 = 'waiting' THEN 'infinity'::timestamptz ELSE prior.at END)
            ELSE t.wake_at END,
        last_error = coalesce($8, t.last_error),
        lease_owner = CASE WHEN $4 = 'running' THEN t.lease_owner END,
        lease_acquired_at = CASE WHEN $4 = 'running' THEN t.lease_acquired_at END,
        lease_expires_at = CASE WHEN $4 = 'running' THEN t.lease_expires_at END,
        wait_signal = CASE WHEN $4 = 'waiting' THEN $19 END,
        signal_cursor = coalesce($20, t.signal_cursor),
        wait_children = CASE WHEN $4 = 'waiting' THEN $21::int4 END,
        -- A run that ends waiting gives its attempt back: attempts count the runs that
        -- failed or crashed, so a handler that waits often is not worn out by it.
        attempts = CASE WHEN $4 = 'waiting' AND prior.state = 'running'
                        THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
        updated_at = now()
    FROM prior
    WHERE t.tenant_id = $1 AND t.id = $2 AND t.state_version = $3
      AND ($9::text IS NULL OR (t.lease_owner = $9 AND t.lease_token = $10))
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id,
              t.created_at, t.updated_at, prior.state AS from_state
    LOOP
        v_trace := coalesce(p_trace_id, agentdb_routed_transition.trace_id);
        v_span := coalesce(p_span_id, agentdb_routed_transition.span_id);
        -- Single-row INSERTs, routed to the shards beside the task's (an
        -- INSERT ... SELECT Citus would plan through the node, as a COPY that
        -- row-level security refuses).
        INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                  from_state, to_state, task_state_version, payload, trace_id,
                                  span_id)
        VALUES (p_tenant_id, p_id, p_event_type, p_actor_id,
                agentdb_routed_transition.workflow_version, v_from,
                agentdb_routed_transition.state, agentdb_routed_transition.state_version,
                p_payload, v_trace, v_span);
        FOR i IN 1 .. coalesce(array_length(p_outbox_ids, 1), 0) LOOP
            INSERT INTO agent_outbox (id, tenant_id, task_id, topic, payload, trace_id, span_id)
            VALUES (p_outbox_ids[i], p_tenant_id, p_id, p_outbox_topics[i], p_outbox_payloads[i],
                    v_trace, v_span);
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$$;

-- agentdb_distribute() redefined whole (0014.citus_scale's, with the
-- delegated functions). See 0012.citus for the rest of its story.
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

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0021.delegated_writes'::text $$;

CALL agentdb_pin_search_paths();

-- On an install that is distributed already, the functions are distributed now.
DO $$
BEGIN
    IF agentdb_distributed() THEN
        CALL agentdb_distribute();
    END IF;
END
$$;
