-- Back to 0014: random (v4) ids by default; the ids made meanwhile stay.
ALTER TABLE agent_tasks ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_operations ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_outbox ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_signals ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_artifacts ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_budgets ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_schedules ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE agent_credential_refs ALTER COLUMN id SET DEFAULT gen_random_uuid();

DROP FUNCTION agentdb_new_id();

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0014.citus_scale'::text $$;

CALL agentdb_pin_search_paths();
