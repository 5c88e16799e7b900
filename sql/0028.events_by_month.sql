-- 0028 events by month (opt-in): the audit trail partitioned by its own
-- created_at, one partition per calendar month (UTC), so retention drops
-- whole months instead of deleting rows one by one (G8, G9).
-- depends: 0027.call_instant
-- phase: expand
--
-- This migration changes no table. It adds what the layout needs and two
-- procedures: agentdb_partition_events() converts agent_events in place
-- (`agentdb migrate --events-by-month` calls it), agentdb_unpartition_events()
-- converts it back. Opt-in because of what it costs: one event per recorded
-- version (G8) cannot be a unique index on a partitioned table (its unique
-- keys must hold created_at, and then they are not unique per version), so
-- two deferred constraint triggers keep the rule - and they cost: the
-- batched cycle's server CPU per task was 1.24-1.34x that of one table on
-- the development machine (partitioning with the triggers off: 1.0-1.1x). A
-- key holding the partition key would cost nothing extra, but needs the
-- task's created_at in every versioned event insert: a change to the insert
-- contract, not made here.
--
-- Partitioned, nothing a writer sends changes: the partition key is the
-- event's own created_at (DEFAULT now()), so the article's INSERT and every
-- runtime statement route on their own. What changes:
--
-- * The primary key is (tenant_id, id, created_at): a partitioned table's
--   unique keys must hold its partition key. id still comes from one sequence.
-- * The triggers keep the unique keys' names (agent_events_task_version_key,
--   agent_events_operation_version_key; errors map on them; the lookup
--   indexes, no longer unique, keep them too): at commit, an event that
--   records task (operation) version v must be the only one recording it, the
--   task must have reached v, and the event may not be more than a day older
--   than the task (a transaction that began before the task was created may
--   still record its versions; one a day older may not).
--   Why "reached v" makes the rule race-free at any isolation level: a second
--   event for v can only pass it in a snapshot that sees the transaction that
--   moved the task to v - and that transaction's own event for v, committed
--   with it. (A row lock on the task covers the one case left: two rivals
--   for a version whose first event retention already deleted.) The
--   last rule bounds every lookup of a task's events to the months since a
--   day before the task was created (run-time partition pruning) instead of
--   probing every month.
-- * The old table becomes the partition agent_events_legacy, holding every
--   instant before next month (UTC); events go on landing there until then.
--   Its rows dated later (an explicit created_at in the future) move to the
--   DEFAULT partition, which takes whatever no month partition covers (a
--   month nobody created yet), so an insert never fails for want of one.
-- * Months are created ahead (this month and the next two at the
--   conversion; then by agentdb_event_partitions(), which `agentdb purge`
--   runs), and a month is dropped whole once it is over and none of its
--   rows is retained any more. The row path (agentdb_purge 'events') stays
--   for the rest.
-- * TRUNCATE triggers are not inherited, so each partition carries its own
--   agent_events_no_truncate. Partitions have no grants: only the owner
--   reaches one directly, and RLS stays on agent_events.
--
-- Converting an install that holds events: one transaction under ACCESS
-- EXCLUSIVE on the old table (event reads and writes wait): three index
-- builds and the attach's check that every row lies before the cut-over.
-- On the 2-core development machine it took 2.3-2.6 s for 1.2 million
-- events (back to one table, which copies every row: 18 s).

-- Two steps both conversions take. On a distributed schema the new table
-- is distributed like the one it replaces, before anything refers to it
-- (dynamic: without Citus there is no pg_dist_partition to name).
CREATE PROCEDURE agentdb_distribute_like(p_old regclass, p_new regclass)
    LANGUAGE plpgsql
AS $$
DECLARE
    distributed boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = $1)'
            INTO distributed USING p_old;
    END IF;
    IF distributed THEN
        EXECUTE 'SELECT create_distributed_table($1, ''tenant_id'', colocate_with => ''agent_tenants'')'
            USING p_new;
    END IF;
END
$$;
-- G15: a table's grants and policies (agentdb's own and any an operator
-- added) go to its replacement; with p_revoke the old one keeps none - a
-- query naming a partition skips the root's policies, so only the owner may
-- name one.
CREATE PROCEDURE agentdb_move_access(p_from regclass, p_to regclass, p_revoke boolean)
    LANGUAGE plpgsql
AS $$
DECLARE
    g record;
    p record;
BEGIN
    FOR g IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who,
               a.privilege_type, a.is_grantable,
               CASE WHEN c.relkind = 'S' THEN 'SEQUENCE ' ELSE '' END AS kind
        FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = p_from AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %s%s TO %s%s', g.privilege_type, g.kind, p_to, g.who,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        IF p_revoke THEN
            EXECUTE format('REVOKE ALL ON %s%s FROM %s', g.kind, p_from, g.who);
        END IF;
    END LOOP;
    FOR p IN
        SELECT y.polname, y.polpermissive, y.polcmd,
               pg_get_expr(y.polqual, y.polrelid) AS qual,
               pg_get_expr(y.polwithcheck, y.polrelid) AS with_check,
               (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE r::regrole::text END, ', ')
                FROM unnest(y.polroles) AS r) AS who
        FROM pg_policy y WHERE y.polrelid = p_from
    LOOP
        EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s',
                       p.polname, p_to, CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                       CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                     WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                       p.who,
                       CASE WHEN p.qual IS NULL THEN '' ELSE ' USING (' || p.qual || ')' END,
                       CASE WHEN p.with_check IS NULL THEN ''
                            ELSE ' WITH CHECK (' || p.with_check || ')' END);
        IF p_revoke THEN
            EXECUTE format('DROP POLICY %I ON %s', p.polname, p_from);
        END IF;
    END LOOP;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_like(regclass, regclass) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_move_access(regclass, regclass, boolean) FROM PUBLIC;

-- G8: at most one event per recorded version, for a version the task or
-- operation has reached, at most a day older than its task or operation.
-- Checked at commit, so the event may come before the state change it records.
CREATE FUNCTION agentdb_event_records_once() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    recorded bigint;
    reached bigint;
    born timestamptz;
    n bigint;
BEGIN
    IF TG_ARGV[0] = 'task' THEN
        recorded := NEW.task_state_version;
        -- The row lock makes writers of one task's events take turns: at READ
        -- COMMITTED the count below then sees a rival committed while this one
        -- waited (a rival for a version whose first event retention deleted).
        -- The transaction that moved the task holds it already; a row lock
        -- takes no room in the lock table, however many events commit at once.
        SELECT t.state_version, t.created_at INTO reached, born FROM agent_tasks t
        WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
        FOR NO KEY UPDATE;
        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN
            SELECT count(*) INTO n FROM (
                SELECT FROM agent_events e
                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id
                  AND e.task_state_version = recorded
                  AND e.created_at >= born - interval '1 day'
                LIMIT 2) twice;
        END IF;
    ELSE
        recorded := NEW.operation_state_version;
        SELECT o.state_version, o.created_at INTO reached, born FROM agent_operations o
        WHERE o.tenant_id = NEW.tenant_id AND o.id = NEW.operation_id
        FOR NO KEY UPDATE;
        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN
            SELECT count(*) INTO n FROM (
                SELECT FROM agent_events e
                WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.operation_id
                  AND e.operation_state_version = recorded
                  AND e.created_at >= born - interval '1 day'
                LIMIT 2) twice;
        END IF;
    END IF;
    IF n IS NULL THEN
        RAISE EXCEPTION 'agentdb: event % records state_version % of % %, % (violates constraint "%")',
                NEW.id, recorded, TG_ARGV[0], coalesce(NEW.operation_id, NEW.task_id),
                CASE WHEN reached >= recorded THEN 'and is older than it'
                     ELSE 'a version it has not reached' END,
                TG_NAME
            USING ERRCODE = '23514', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    ELSIF n > 1 THEN
        -- Citus drops the constraint field of a worker's error: the name is in
        -- the message too (TG_NAME carries the shard id there; agentdb strips it).
        RAISE EXCEPTION 'agentdb: two events record state_version % of % % (violates constraint "%")',
                recorded, TG_ARGV[0], coalesce(NEW.operation_id, NEW.task_id), TG_NAME
            USING ERRCODE = '23505', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G8: 0004's agentdb_require_event for events by month: the lookup bounded
-- to the months since a day before the task or operation was created (its
-- events are never older: agentdb_event_records_once).
CREATE FUNCTION agentdb_require_event_by_month() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.id
          AND e.task_state_version = NEW.state_version
          AND e.created_at >= NEW.created_at - interval '1 day';
    ELSE
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.id
          AND e.operation_state_version = NEW.state_version
          AND e.created_at >= NEW.created_at - interval '1 day';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agentdb: % % reached state_version % (%) without an event',
                TG_ARGV[0], NEW.id, NEW.state_version, NEW.state
            USING ERRCODE = 'AG006', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G8/G9: drop every month that is over and holds no row retained any more,
-- then create the month partitions from this month to p_ahead months on. A
-- month whose rows already sit in the DEFAULT partition is left there
-- (retention deletes them row by row). Owner only by default, like
-- agentdb_purge. The lock_timeout keeps a drop or a create (ACCESS EXCLUSIVE
-- on agent_events) from queueing event writes behind a long transaction:
-- such a month is reported 'busy, skipped' and tried again on the next run.
-- Drops come first, so a month is counted before this run holds any lock.
-- READ COMMITTED only: the check under the lock must see a row committed
-- while it waited, which a transaction snapshot would not. TimeZone and
-- DateStyle are fixed, so month bounds are written and read back in UTC.
CREATE FUNCTION agentdb_event_partitions(p_ahead integer)
    RETURNS TABLE (partition_name text, action text, events bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout = '2s' SET "TimeZone" = 'UTC' SET "DateStyle" = 'ISO, YMD'
AS $$
DECLARE
    parent regclass := 'agent_events'::regclass;
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = 'agent_events'::regclass);
    month timestamptz := date_trunc('month', now(), 'UTC');
    lo timestamptz;
    part record;
    upper_bound timestamptz;
    retained boolean;
    -- Whether a month still holds a row within its retention.
    holds_retained constant text := 'SELECT EXISTS (SELECT 1 FROM %s WHERE retain_until > now())';
    n bigint;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = parent) <> 'p' THEN
        RETURN;  -- one table (agentdb_partition_events() not run): no month to keep
    END IF;
    IF p_ahead IS NULL OR p_ahead < 0 OR p_ahead > 24 THEN
        RAISE EXCEPTION 'agentdb: months ahead must be between 0 and 24, not %', p_ahead
            USING ERRCODE = '22023';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'agentdb: agentdb_event_partitions runs at READ COMMITTED, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = '25000',
                  HINT = 'a snapshot taken before a late insert into a month would let the month be dropped with it';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;

    FOR part IN
        SELECT c.oid::regclass AS rel, c.relname,
               pg_get_expr(c.relpartbound, c.oid) AS bound
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent
        ORDER BY c.relname
    LOOP
        CONTINUE WHEN part.bound = 'DEFAULT';
        upper_bound := (regexp_match(part.bound, 'TO \(''([^'']+)''\)$'))[1]::timestamptz;
        -- Rows keep arriving in a month until it is over.
        CONTINUE WHEN upper_bound IS NULL OR upper_bound > now();
        EXECUTE format(holds_retained, part.rel) INTO STRICT retained;
        CONTINUE WHEN retained;
        EXECUTE format('SELECT count(*) FROM %s', part.rel) INTO STRICT n;
        partition_name := part.relname;
        BEGIN
            LOCK TABLE agent_events IN ACCESS EXCLUSIVE MODE;
            -- Again under the lock: a late insert may carry a longer retention.
            EXECUTE format(holds_retained, part.rel) INTO STRICT retained;
            CONTINUE WHEN retained;
            EXECUTE format('DROP TABLE %s', part.rel);
            action := 'dropped';
            events := n;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            action := 'busy, skipped';
            events := 0;
        END;
        RETURN NEXT;
    END LOOP;

    FOR i IN 0..p_ahead LOOP
        lo := month + make_interval(months => i);
        partition_name := 'agent_events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYY_MM');
        CONTINUE WHEN to_regclass(format('%I.%I', nsp, partition_name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           nsp, partition_name, parent, lo, lo + interval '1 month');
            EXECUTE format('CREATE TRIGGER agent_events_no_truncate BEFORE TRUNCATE ON %I.%I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only()',
                           nsp, partition_name);
            action := 'created';
        EXCEPTION
            -- The month lies in the legacy partition's range.
            WHEN invalid_object_definition THEN
                CONTINUE;
            -- Rows of that month already sit in the DEFAULT partition.
            WHEN check_violation THEN
                action := 'left in the default partition';
            -- Another session holds agent_events, or created the month first.
            WHEN lock_not_available OR deadlock_detected OR duplicate_table THEN
                action := 'busy, skipped';
        END;
        events := 0;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_event_partitions(integer) FROM PUBLIC;

-- G9: the row purges of events by the whole primary key (tenant_id, id,
-- created_at). An id is unique only with its created_at now: by (tenant_id,
-- id) alone, a row inserted with a copied id (anyone who may INSERT events
-- may name one) would be taken along with the expired row it copies - and a
-- retained one refused by the append-only guard, failing the whole batch.
-- 0027's routines are kept as *_0027 for the other classes.
ALTER FUNCTION agentdb_purge(text, integer, interval) RENAME TO agentdb_purge_0027;
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind IS DISTINCT FROM 'events' AND p_kind IS DISTINCT FROM 'event_payloads' THEN
        RETURN agentdb_purge_0027(p_kind, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    IF p_kind = 'event_payloads' THEN
        UPDATE agent_events e SET payload = NULL
        FROM (SELECT tenant_id, id, created_at FROM agent_events
              WHERE payload IS NOT NULL AND payload_expires_at <= now()
              LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    ELSE
        DELETE FROM agent_events e
        USING (SELECT tenant_id, id, created_at FROM agent_events WHERE retain_until <= now()
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
ALTER FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant_0027;
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind IS DISTINCT FROM 'events' AND p_kind IS DISTINCT FROM 'event_payloads' THEN
        RETURN agentdb_purge_tenant_0027(p_tenant, p_kind, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    -- On Citus each statement names the tenant, so it routes to its shard.
    IF p_kind = 'event_payloads' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND payload IS NOT NULL AND payload_expires_at <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        UPDATE agent_events e SET payload = NULL FROM v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    ELSE
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND retain_until <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_events e USING v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_0027(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant_0027(uuid, text, integer, interval) FROM PUBLIC;
-- A maintenance role the owner let purge keeps purging: what it could run it
-- can run now, and the month rotation `agentdb purge` starts with.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT p.proname, quote_ident(r.rolname) AS who
        FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname IN ('agentdb_purge_0027', 'agentdb_purge_tenant_0027')
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        IF g.proname = 'agentdb_purge_0027' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) TO %s', g.who);
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) TO %s',
                           g.who);
        END IF;
        EXECUTE format('GRANT EXECUTE ON FUNCTION agentdb_event_partitions(integer) TO %s', g.who);
    END LOOP;
END
$$;

-- 0027's distribution (kept as agentdb_distribute_0027), with agent_events'
-- insert triggers paused for the copy on the partitioned table itself. The
-- pause of 0023/0015 walks plain tables, which now include the partitions,
-- and Citus cannot enable a partition's clone of a trigger again by its name
-- on the shards (42704 "trigger ..._102232 does not exist"). Paused on the
-- parent, the clones are paused with it, the walk passes them by (it skips
-- disabled triggers), and one ENABLE on the parent covers every partition.
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0027;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    paused text[] := '{}';
    name text;
    distributed boolean := true;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition p
                                WHERE p.logicalrelid = ''agent_events''::regclass)'
            INTO distributed;
    END IF;
    IF NOT distributed
       AND (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        FOR name IN
            SELECT t.tgname FROM pg_trigger t
            WHERE t.tgrelid = 'agent_events'::regclass AND NOT t.tgisinternal
              AND t.tgenabled <> 'D' AND t.tgtype & 5 = 5  -- row-level insert, as 0015
            ORDER BY t.tgname
        LOOP
            EXECUTE format('ALTER TABLE agent_events DISABLE TRIGGER %I', name);
            paused := paused || name;
        END LOOP;
    END IF;
    CALL agentdb_distribute_0027(p_shard_count);
    FOREACH name IN ARRAY paused LOOP
        EXECUTE format('ALTER TABLE agent_events ENABLE TRIGGER %I', name);
    END LOOP;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0027(integer) FROM PUBLIC;

-- Events by month, opt-in: `agentdb migrate --events-by-month`, or CALL
-- agentdb_partition_events() as the owner. Does nothing (a NOTICE) if
-- agent_events is partitioned already.
CREATE PROCEDURE agentdb_partition_events()
    LANGUAGE plpgsql
AS $$
DECLARE
    cutover timestamptz := date_trunc('month', now(), 'UTC') + interval '1 month';
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        RAISE NOTICE 'agentdb: agent_events is partitioned by month already';
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    -- The old table, renamed; its name comes back as the partitioned table.
    ALTER TABLE agent_events RENAME TO agent_events_legacy;
    ALTER INDEX agent_events_retain_until_idx RENAME TO agent_events_legacy_retain_until_idx;
    ALTER INDEX agent_events_payload_expiry_idx RENAME TO agent_events_legacy_payload_expiry_idx;
    ALTER TABLE agent_events_legacy DROP CONSTRAINT agent_events_pkey;
    DROP INDEX agent_events_task_version_key;
    DROP INDEX agent_events_operation_version_key;
    -- Row triggers come back as clones of the partitioned table's.
    DROP TRIGGER agent_events_append_only ON agent_events_legacy;
    -- The ids: a new sequence, owned by the partitioned table, going on where
    -- the old one stopped (nothing draws from it in between: the table is
    -- locked). The old one stays with the legacy partition and goes with it -
    -- Citus cannot give a distributed table's sequence another owner. The two
    -- swap names at the end: on Citus, renaming a sequence before a table using
    -- the other is distributed deadlocks with the distribution's own connections.
    CREATE SEQUENCE agent_events_id_seq_0028 AS bigint;
    PERFORM setval('agent_events_id_seq_0028', s.last_value, s.is_called) FROM agent_events_id_seq s;

    CREATE TABLE agent_events (
        LIKE agent_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    ) PARTITION BY RANGE (created_at);
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_0028');
    ALTER SEQUENCE agent_events_id_seq_0028 OWNED BY agent_events.id;
    -- An insert naming the old table would draw ids the new sequence hands out
    -- again: without a default there, it must name its id.
    ALTER TABLE agent_events_legacy ALTER COLUMN id DROP DEFAULT;

    CALL agentdb_distribute_like('agent_events_legacy', 'agent_events');

    -- G15: the old table's grants and policies move to agent_events.
    CALL agentdb_move_access('agent_events_legacy', 'agent_events', true);
    ALTER TABLE agent_events_legacy NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE agent_events_legacy DISABLE ROW LEVEL SECURITY;

    ALTER TABLE agent_events ADD CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id, created_at);
    -- G2
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_operation_fkey
        FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_operations (tenant_id, id);
    -- G8: the lookups of the deferred event checks and of a task's or an
    -- operation's events (no longer unique: see the triggers below).
    CREATE INDEX agent_events_task_version_key
        ON agent_events (tenant_id, task_id, task_state_version);
    CREATE INDEX agent_events_operation_version_key
        ON agent_events (tenant_id, operation_id, operation_state_version)
        WHERE operation_id IS NOT NULL;
    -- G9: the retention paths.
    CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
    CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
        WHERE payload IS NOT NULL;

    -- G8: append-only, as 0004 - the row triggers are cloned onto every partition.
    CREATE TRIGGER agent_events_append_only
        BEFORE UPDATE OR DELETE ON agent_events
        FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

    CREATE CONSTRAINT TRIGGER agent_events_task_version_key
        AFTER INSERT ON agent_events
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.task_state_version IS NOT NULL)
        EXECUTE FUNCTION agentdb_event_records_once('task');
    CREATE CONSTRAINT TRIGGER agent_events_operation_version_key
        AFTER INSERT ON agent_events
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.operation_state_version IS NOT NULL)
        EXECUTE FUNCTION agentdb_event_records_once('operation');

    -- The old table becomes the partition for everything before next month
    -- (UTC); a row of it dated later (an explicit created_at) moves first to the
    -- DEFAULT partition, made here as a plain table (no guard on the old table
    -- now: its append-only trigger was dropped above and comes back as a clone).
    CREATE TABLE agent_events_default (LIKE agent_events_legacy INCLUDING CONSTRAINTS);
    CALL agentdb_distribute_like('agent_events_legacy', 'agent_events_default');
    INSERT INTO agent_events_default SELECT * FROM agent_events_legacy WHERE created_at >= cutover;
    DELETE FROM agent_events_legacy WHERE created_at >= cutover;
    EXECUTE format('ALTER TABLE agent_events ATTACH PARTITION agent_events_legacy '
                       'FOR VALUES FROM (MINVALUE) TO (%L)',
                       to_char(cutover AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00');
    ALTER TABLE agent_events ATTACH PARTITION agent_events_default DEFAULT;
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events_default
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();
    PERFORM count(*) FROM agentdb_event_partitions(2);

    -- USAGE on the ids goes with them.
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_0028', false);
    ALTER SEQUENCE agent_events_id_seq RENAME TO agent_events_legacy_id_seq;
    ALTER SEQUENCE agent_events_id_seq_0028 RENAME TO agent_events_id_seq;

    -- G15 (the policies came over from the old table above)
    ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
    ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;


    -- G8: the deferred check that a state change has its event looks in the
    -- task's months only.
    DROP TRIGGER agent_tasks_event_required ON agent_tasks;
    CREATE CONSTRAINT TRIGGER agent_tasks_event_required
        AFTER INSERT OR UPDATE ON agent_tasks
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event_by_month('task');
    DROP TRIGGER agent_operations_event_required ON agent_operations;
    CREATE CONSTRAINT TRIGGER agent_operations_event_required
        AFTER INSERT OR UPDATE ON agent_operations
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event_by_month('operation');
END
$$;

-- Back to one table: every row copied out of the partitions (a rewrite of
-- the audit trail, under ACCESS EXCLUSIVE for as long as the copy takes),
-- one event per version a unique index again. Does nothing if agent_events
-- is one table. The 0028 rollback runs it.
CREATE PROCEDURE agentdb_unpartition_events()
    LANGUAGE plpgsql
AS $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    ALTER TABLE agent_events RENAME TO agent_events_by_month;
    ALTER INDEX agent_events_retain_until_idx RENAME TO agent_events_by_month_retain_until_idx;
    ALTER INDEX agent_events_payload_expiry_idx RENAME TO agent_events_by_month_payload_expiry_idx;
    -- (Dropped, not renamed: Citus cannot rename a distributed table's constraint.)
    ALTER TABLE agent_events_by_month DROP CONSTRAINT agent_events_pkey;

    -- A new id sequence, as 0028 made one (Citus cannot give a distributed
    -- table's sequence another owner); it takes the old name once the old one
    -- is gone with its table.
    CREATE SEQUENCE agent_events_id_seq_0027 AS bigint;
    PERFORM setval('agent_events_id_seq_0027', s.last_value, s.is_called) FROM agent_events_id_seq s;
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_0027', false);

    CREATE TABLE agent_events (
        LIKE agent_events_by_month INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    );
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_0027');
    ALTER SEQUENCE agent_events_id_seq_0027 OWNED BY agent_events.id;
    CALL agentdb_distribute_like('agent_events_by_month', 'agent_events');
    INSERT INTO agent_events SELECT * FROM agent_events_by_month;
    -- G15: grants and policies go with the table, as 0028 moved them.
    CALL agentdb_move_access('agent_events_by_month', 'agent_events', false);
    DROP TABLE agent_events_by_month;
    ALTER SEQUENCE agent_events_id_seq_0027 RENAME TO agent_events_id_seq;

    ALTER TABLE agent_events ADD CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_operation_fkey
        FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_operations (tenant_id, id);
    CREATE UNIQUE INDEX agent_events_task_version_key
        ON agent_events (tenant_id, task_id, task_state_version);
    CREATE UNIQUE INDEX agent_events_operation_version_key
        ON agent_events (tenant_id, operation_id, operation_state_version)
        WHERE operation_id IS NOT NULL;
    CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
    CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
        WHERE payload IS NOT NULL;
    CREATE TRIGGER agent_events_append_only
        BEFORE UPDATE OR DELETE ON agent_events
        FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

    DROP TRIGGER agent_tasks_event_required ON agent_tasks;
    CREATE CONSTRAINT TRIGGER agent_tasks_event_required
        AFTER INSERT OR UPDATE ON agent_tasks
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('task');
    DROP TRIGGER agent_operations_event_required ON agent_operations;
    CREATE CONSTRAINT TRIGGER agent_operations_event_required
        AFTER INSERT OR UPDATE ON agent_operations
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('operation');

    ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
    ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_partition_events() FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_unpartition_events() FROM PUBLIC;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0028.events_by_month'::text $$;

CALL agentdb_pin_search_paths();
