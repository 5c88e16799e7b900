-- Back to 0015: 0004's prefilter (the bare word `token`).
CREATE OR REPLACE FUNCTION agentdb_jsonb_has_secrets(doc jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT doc::text ~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)'
       AND EXISTS (
        SELECT 1
        FROM jsonb_path_query(doc, 'strict $.**') AS node (v)
        WHERE (jsonb_typeof(node.v) = 'object'
               AND EXISTS (SELECT 1 FROM jsonb_each(node.v) AS kv (key, value)
                           WHERE agentdb_is_secret_key(kv.key)
                             AND kv.value <> '"[redacted]"'::jsonb))
           OR (jsonb_typeof(node.v) = 'string' AND agentdb_is_secret_value(node.v #>> '{}'))
    )
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0015.citus_existing_data'::text $$;

CALL agentdb_pin_search_paths();
