-- Back to 0016: agentdb_notify() is 0001.foundation's, which notifies always.

-- A hint no guarantee rests on: wake idle workers and relays when work
-- arrives. Listeners also poll, so nothing depends on it arriving (it does
-- not behind a transaction-pooling proxy). Its triggers are statement-level:
-- one notification per statement, not per row, and Postgres folds identical
-- notifications within a transaction into one.
CREATE OR REPLACE FUNCTION agentdb_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0016.partial_keys'::text $$;

CALL agentdb_pin_search_paths();
