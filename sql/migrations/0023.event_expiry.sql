-- 0023 event expiry: one index for both retention paths of the audit trail
-- (G9; issue 41, WAL).
-- depends: 0022.lease_expiry
-- phase: expand
--
-- * agent_events_expiry_idx replaces agent_events_retain_until_idx and
--   agent_events_payload_expiry_idx. It orders every event by the next thing
--   retention does to it: erase its payload at payload_expires_at while it has
--   one, then delete it at retain_until -
--   (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END).
-- * Why. Every event wrote an entry in each of the two indexes: about 64 bytes
--   of WAL apiece, five events per single-effect unit (docs/benchmarks.md,
--   "WAL, part 3"). One entry now serves both.
-- * The purge reads the same range for both classes, and each class filters
--   it: 'event_payloads' takes the rows that still have a payload (for them the
--   key is payload_expires_at, as the old partial index's was); 'events' takes
--   those past retain_until - each of them is in the range, because
--   payload_expires_at <= retain_until (agent_events_retention_order). So each
--   statement picks exactly the rows it picked before. What the range holds
--   besides is what the other class takes next (a purge runs event_payloads,
--   then events), not the retained history. (A purge told to take events
--   alone, payloads never erased, walks the expired payloads at each step.)
-- * Erasing a payload moves the row's key from payload_expires_at to
--   retain_until: the erase was not a HOT update before either (the old
--   partial index's predicate reads payload), so it costs what it cost.
-- * agentdb_purge, agentdb_purge_tenant (0020.books_first's), and the events
--   by month procedures (0011.retention's) are redefined whole; only the
--   lines naming the indexes or the retention predicates are new. On a table
--   already partitioned by month, or distributed, the index is made on the
--   parent and reaches every partition and shard.

DROP INDEX agent_events_retain_until_idx;
DROP INDEX agent_events_payload_expiry_idx;
-- G9
CREATE INDEX agent_events_expiry_idx ON agent_events
    ((CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END));
-- By month, the old table's partition keeps the name the conversion gives its
-- index (agentdb_partition_events below), whatever the order of the two.
-- (Not IF EXISTS: its NOTICE would print at every migration of one table.)
DO $$
BEGIN
    IF to_regclass('agent_events_legacy_expr_idx') IS NOT NULL THEN
        ALTER INDEX agent_events_legacy_expr_idx RENAME TO agent_events_legacy_expiry_idx;
    END IF;
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
              WHERE (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
                AND payload IS NOT NULL
              LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        DELETE FROM agent_events e
        USING (SELECT tenant_id, id, created_at FROM agent_events
               WHERE (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
                 AND retain_until <= now()
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
                 AND NOT EXISTS (SELECT 1 FROM agent_budget_holds h
                                 WHERE h.tenant_id = op.tenant_id AND h.operation_id = op.id)
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
            WHERE tenant_id = p_tenant
              AND (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
              AND payload IS NOT NULL
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        UPDATE agent_events e SET payload = NULL FROM v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant
              AND (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
              AND retain_until <= now()
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
              AND NOT EXISTS (SELECT 1 FROM agent_budget_holds h
                              WHERE h.tenant_id = p_tenant AND h.operation_id = op.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_operations o USING v WHERE o.tenant_id = p_tenant AND o.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Events by month, opt-in: `agentdb migrate --events-by-month`, or CALL
-- agentdb_partition_events() as the owner. Does nothing (a NOTICE) if
-- agent_events is partitioned already.
CREATE OR REPLACE PROCEDURE agentdb_partition_events()
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
    ALTER INDEX agent_events_expiry_idx RENAME TO agent_events_legacy_expiry_idx;
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
    CREATE SEQUENCE agent_events_id_seq_by_month AS bigint;
    PERFORM setval('agent_events_id_seq_by_month', s.last_value, s.is_called) FROM agent_events_id_seq s;

    CREATE TABLE agent_events (
        LIKE agent_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    ) PARTITION BY RANGE (created_at);
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_by_month');
    ALTER SEQUENCE agent_events_id_seq_by_month OWNED BY agent_events.id;
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
    -- G9: the retention paths (0023.event_expiry).
    CREATE INDEX agent_events_expiry_idx ON agent_events
        ((CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END));

    -- G8: append-only, as one table is - the row triggers are cloned onto every partition.
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
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_by_month', false);
    ALTER SEQUENCE agent_events_id_seq RENAME TO agent_events_legacy_id_seq;
    ALTER SEQUENCE agent_events_id_seq_by_month RENAME TO agent_events_id_seq;

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
-- is one table. The rollback of this migration runs it.
CREATE OR REPLACE PROCEDURE agentdb_unpartition_events()
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
    ALTER INDEX agent_events_expiry_idx RENAME TO agent_events_by_month_expiry_idx;
    -- (Dropped, not renamed: Citus cannot rename a distributed table's constraint.)
    ALTER TABLE agent_events_by_month DROP CONSTRAINT agent_events_pkey;

    -- A new id sequence, as the conversion made one (Citus cannot give a distributed
    -- table's sequence another owner); it takes the old name once the old one
    -- is gone with its table.
    CREATE SEQUENCE agent_events_id_seq_one_table AS bigint;
    PERFORM setval('agent_events_id_seq_one_table', s.last_value, s.is_called) FROM agent_events_id_seq s;
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_one_table', false);

    CREATE TABLE agent_events (
        LIKE agent_events_by_month INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    );
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_one_table');
    ALTER SEQUENCE agent_events_id_seq_one_table OWNED BY agent_events.id;
    CALL agentdb_distribute_like('agent_events_by_month', 'agent_events');
    INSERT INTO agent_events SELECT * FROM agent_events_by_month;
    -- G15: grants and policies go with the table, as the conversion moved them.
    CALL agentdb_move_access('agent_events_by_month', 'agent_events', false);
    DROP TABLE agent_events_by_month;
    ALTER SEQUENCE agent_events_id_seq_one_table RENAME TO agent_events_id_seq;

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
    CREATE INDEX agent_events_expiry_idx ON agent_events
        ((CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END));
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

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0023.event_expiry'::text $$;

CALL agentdb_pin_search_paths();
