-- 0015 time-ordered ids: new rows' ids sort by when they were made (issue 41).
-- depends: 0014.citus_scale
-- phase: expand
--
-- * agentdb_new_id(): a UUIDv7 (RFC 9562) - 48 bits of Unix milliseconds,
--   the version and variant, 74 random bits - the id the runtime makes
--   client-side (agentdb/_ids.py says why: each index on a tenant's rows by
--   id, or by a key that starts with one, takes a tenant's new rows on the
--   same few rightmost pages instead of a random page each, so the WAL carries
--   a full-page image of each page once per checkpoint, not once per row).
-- * It is the default of every id the database may make, but a tenant's:
--   tasks, operations, messages, signals, artifacts, budgets, schedules and
--   credential references. A tenant id stays random: it is what Citus
--   distributes by, and nothing indexes a tenant's rows by when it was made.
-- * Ids already written stay as they are; old and new ids mix freely (both
--   are uuids, and nothing reads an id's bits).

-- agentdb_new_id(): a UUIDv7. Volatile (each call is new); parallel safe.
-- gen_random_uuid()'s 16 bytes with the first 6 overwritten by the
-- milliseconds, then the version nibble turned from 4 (0100) into 7 (0111)
-- by setting bits 52 and 53; the variant bits of a v4 are a v7's already.
CREATE FUNCTION agentdb_new_id() RETURNS uuid
    LANGUAGE sql
    VOLATILE
    PARALLEL SAFE
AS $$
    SELECT encode(
        set_bit(
            set_bit(
                overlay(
                    uuid_send(gen_random_uuid())
                    PLACING substring(
                        int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                        FROM 3)
                    FROM 1 FOR 6),
                52, 1),
            53, 1),
        'hex')::uuid
$$;

ALTER TABLE agent_tasks ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_operations ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_outbox ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_signals ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_artifacts ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_budgets ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_schedules ALTER COLUMN id SET DEFAULT agentdb_new_id();
ALTER TABLE agent_credential_refs ALTER COLUMN id SET DEFAULT agentdb_new_id();

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0015.time_ordered_ids'::text $$;

CALL agentdb_pin_search_paths();
