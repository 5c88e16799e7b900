-- 0015 citus existing data: `agentdb migrate --citus` on a database that
-- already holds rows (an installation moving to Citus).
-- depends: 0014.budgets
-- phase: expand
--
-- create_distributed_table copies a table's rows into its new shards, and
-- the shards' triggers fire on that copy, on the workers: where the tables
-- those triggers read (agent_transitions, agent_concurrency_limits,
-- agent_rate_limits, ...) may not be distributed yet - the distribution
-- failed with XX000 "relation ... does not exist" - and where they would
-- check again rows they already passed when written. So agentdb's enabled
-- row-level insert triggers on the tables not yet distributed are disabled for the
-- distribution and enabled again, on the distributed tables and all their
-- shards, before it commits. It is one transaction holding the tables
-- locked: no writer ever runs while they are off. A trigger someone had
-- disabled stays disabled; one the distribution drops (the NOTIFY hints)
-- stays dropped.

ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0014;

CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    r record;
    rels text[] := '{}';
    names text[] := '{}';
    i integer;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        FOR r IN
            SELECT c.oid::regclass::text AS rel, t.tgname
            FROM pg_trigger t
            JOIN pg_class c ON c.oid = t.tgrelid
            WHERE c.relnamespace = current_schema()::regnamespace
              AND c.relname LIKE 'agent\_%' AND c.relkind = 'r'
              AND NOT t.tgisinternal AND t.tgenabled <> 'D'
              -- Row-level insert triggers only (TRIGGER_TYPE_ROW 1, INSERT 4):
              -- the copy fires nothing else, and Citus does not carry ENABLE
              -- of a TRUNCATE trigger to the shards.
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
    END IF;
    CALL agentdb_distribute_0014(p_shard_count);
    FOR i IN 1 .. coalesce(array_length(rels, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger t
                   WHERE t.tgrelid = rels[i]::regclass AND t.tgname = names[i]) THEN
            EXECUTE format('ALTER TABLE %s ENABLE TRIGGER %I', rels[i], names[i]);
        END IF;
    END LOOP;
END
$$;

REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0014(integer) FROM PUBLIC;

-- The newest migration this schema has; replaced by every later migration.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0015.citus_existing_data'::text $$;

CALL agentdb_pin_search_paths();
