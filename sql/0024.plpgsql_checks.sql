-- 0024 plpgsql checks: the functions a hot statement calls are PL/pgSQL,
-- so each statement no longer plans a SQL function's body again.
-- depends: 0023.schedules
-- phase: expand
--
-- Every agentdb function is pinned to its schema's search_path (0001), and
-- PostgreSQL never inlines a SQL function that carries a SET clause. A SQL
-- function that is not inlined parses and plans its body once per statement
-- that calls it: about 190 us for agentdb_jsonb_has_secrets, which every
-- event insert runs through agent_events_payload_no_secrets (G9), against
-- about 20 us for a single-row insert with no check at all (measured on
-- PostgreSQL 15, one event per statement, as the runtime writes them). A
-- PL/pgSQL function keeps its compiled body and its query plans for the
-- session, so the same check costs a few microseconds. The same holds for
-- the other functions a frequent statement calls: agentdb_current_tenant in
-- every agent-role policy (G15), agentdb_running_count in the claim and cap
-- guard (G18) and agentdb_children_done in the fan-in (G23).
--
-- What each function answers is unchanged. The two counts stay VOLATILE: a
-- PL/pgSQL query in a VOLATILE function takes a fresh snapshot, as the SQL
-- function's did, so a count still sees what another transaction committed
-- after the calling statement began. CREATE OR REPLACE drops a function's
-- SET clauses: the search paths are pinned again below, and a distributed
-- install gets back the Citus setting 0013 and 0021 gave these functions.

-- G9: true when, anywhere in the document, a key names a secret (and its
-- value is not the redaction mask "[redacted]") or a string looks like one.
-- The prefilter is 0016's: one case-insensitive regex over the JSON text,
-- a prefix of every key and value pattern; only a document that matches is
-- walked node by node. NULL (an erased payload) has no secret.
CREATE OR REPLACE FUNCTION agentdb_jsonb_has_secrets(doc jsonb) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF doc IS NULL
       OR doc::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)' THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        SELECT 1
        FROM jsonb_path_query(doc, 'strict $.**') AS node (v)
        WHERE (jsonb_typeof(node.v) = 'object'
               AND EXISTS (SELECT 1 FROM jsonb_each(node.v) AS kv (key, value)
                           WHERE agentdb_is_secret_key(kv.key)
                             AND kv.value <> '"[redacted]"'::jsonb))
           OR (jsonb_typeof(node.v) = 'string' AND agentdb_is_secret_value(node.v #>> '{}'))
    );
END
$$;

-- G15: the tenant the current session may see. A pinned login role wins over
-- the setting; an unpinned session (a trusted runtime that did SET LOCAL ROLE)
-- uses agentdb.tenant_id; otherwise NULL, which matches no row.
CREATE OR REPLACE FUNCTION agentdb_current_tenant() RETURNS uuid
    LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN coalesce(
        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),
        nullif(current_setting('agentdb.tenant_id', true), '')::uuid
    );
END
$$;

-- G18: how many of a tenant's tasks run now ('*': of every type), counted in
-- a fresh snapshot (VOLATILE).
CREATE OR REPLACE FUNCTION agentdb_running_count(p_tenant uuid, p_task_type text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM agent_tasks t
    WHERE t.tenant_id = p_tenant AND t.state = 'running'
      AND (p_task_type = '*' OR t.task_type = p_task_type);
    RETURN n;
END
$$;

-- G23: how many of a task's children have finished, counted in a fresh
-- snapshot (VOLATILE).
CREATE OR REPLACE FUNCTION agentdb_children_done(p_tenant uuid, p_parent uuid) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM agent_tasks c
    WHERE c.tenant_id = p_tenant AND c.parent_id = p_parent
      AND c.state IN ('succeeded', 'failed', 'cancelled', 'dead');
    RETURN n;
END
$$;

-- Applied to an install that is distributed already: the nested execution
-- 0013 and 0021 allowed these functions (CREATE OR REPLACE dropped it).
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
AS $$ SELECT '0024.plpgsql_checks'::text $$;

CALL agentdb_pin_search_paths();
