-- Validation has nothing to undo: 0025's rollback replaces the constraint.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0025.events_diet'::text $$;

CALL agentdb_pin_search_paths();
