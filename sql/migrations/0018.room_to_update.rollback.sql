-- Back to 0017: the default fillfactor (pages already written keep their room).
ALTER TABLE agent_tasks RESET (fillfactor);
ALTER TABLE agent_operations RESET (fillfactor);

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0017.wake_after_commit'::text $$;

CALL agentdb_pin_search_paths();
