-- 0016 secret prefilter: the G9 secret check no longer walks every payload
-- that says "token".
-- depends: 0015.citus_existing_data
-- phase: expand
--
-- agentdb_jsonb_has_secrets (0004) runs on every event insert. It first
-- tries one case-insensitive regex over the JSON text and walks the
-- document node by node only when that matches. 0004's prefilter had the
-- bare word `token` for the key pattern
-- `(access|refresh|id|auth|session)[_-]?token`, so every payload naming
-- the unit `tokens` - each costed reservation and settlement of G19
-- (`"cost": {"tokens": 8000}`) - took the walk, about ten times the cost
-- of the regex, to find nothing. The prefilter now carries that key pattern
-- itself. What the walk refuses is unchanged, and every key or string it
-- refuses still contains a match of one of the prefilter's alternatives:
-- each alternative is a prefix or a copy of a key or value pattern, in
-- characters JSON text never escapes.

-- G9
CREATE OR REPLACE FUNCTION agentdb_jsonb_has_secrets(doc jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT doc::text ~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)'
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

-- The newest migration this schema has; replaced by every later migration.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0016.secret_prefilter'::text $$;

CALL agentdb_pin_search_paths();
