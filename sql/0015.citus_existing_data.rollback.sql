-- Back to 0014: agentdb_distribute without the trigger pause (a populated
-- database then fails to distribute, as before).
DROP PROCEDURE agentdb_distribute(integer);
ALTER PROCEDURE agentdb_distribute_0014(integer) RENAME TO agentdb_distribute;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0014.budgets'::text $$;

CALL agentdb_pin_search_paths();
