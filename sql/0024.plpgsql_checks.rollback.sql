-- Back to the SQL functions 0016, 0001, 0012 and 0021 wrote.
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

CREATE OR REPLACE FUNCTION agentdb_current_tenant() RETURNS uuid
    LANGUAGE sql STABLE SECURITY DEFINER
AS $$
    SELECT coalesce(
        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),
        nullif(current_setting('agentdb.tenant_id', true), '')::uuid
    )
$$;

CREATE OR REPLACE FUNCTION agentdb_running_count(p_tenant uuid, p_task_type text) RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
    SELECT count(*) FROM agent_tasks t
    WHERE t.tenant_id = p_tenant AND t.state = 'running'
      AND (p_task_type = '*' OR t.task_type = p_task_type)
$$;

CREATE OR REPLACE FUNCTION agentdb_children_done(p_tenant uuid, p_parent uuid) RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
    SELECT count(*) FROM agent_tasks c
    WHERE c.tenant_id = p_tenant AND c.parent_id = p_parent
      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead')
$$;

DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_current_tenant() SET citus.allow_nested_distributed_execution = on;
        ALTER FUNCTION agentdb_running_count(uuid, text) SET citus.allow_nested_distributed_execution = on;
        ALTER FUNCTION agentdb_children_done(uuid, uuid) SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0023.schedules'::text $$;

CALL agentdb_pin_search_paths();
