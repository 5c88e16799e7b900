-- 0001 foundation: tenants, principals pinned to a tenant, the lifecycle
-- transition table, and the routines every later migration uses: the tenant
-- scope, the transition guard, the secret checks, the NOTIFY hint, the
-- append-only refusal and the search-path pin.
-- phase: expand
--
-- The migrations in this folder are the squashed baseline of agentdb (one per
-- concept: tasks, operations, events, delivery, control flow, schedules,
-- steps, budgets, access, retention, Citus). sql/schema.sql is what they
-- leave behind, object by object; these files say why. Each routine is
-- defined once, whole, in the migration of its concept; a later migration
-- that changes one redefines it whole (CREATE OR REPLACE) and its rollback
-- restores the previous body whole (CONTRIBUTING.md).
--
-- Every object is created unqualified, in the first schema of the search_path,
-- so these files can be applied into any schema (agentdb migrate --schema, or
-- agentdb sql --schema) and pasted into an existing database.
--
-- Guards raise their own SQLSTATEs (class AG) and name the trigger in the
-- CONSTRAINT field, so callers map errors without reading message text:
--   AG001 invalid transition (G6)             AG010 budget rule (G19)
--   AG002 state_version rule (G7)             AG011 rate limit used up (G19)
--   AG003 append-only record (G8, G16, G22)   AG012 the task has finished (G20)
--   AG004 immutable identity (G2)             AG013 the deadline has passed (G21)
--   AG005 lease token regression (G12)        AG014 signal cursor or approval (G22)
--   AG006 state change without event (G8)     AG015 a signal needs READ COMMITTED (G22)
--   AG007 no tenant scope (G15)               AG016 a fan-in needs READ COMMITTED (G23)
--   AG008 key bound to its request (G4)       AG017 not a due tick of a schedule (G24)
--   AG009 concurrency cap reached (G18)       AG018 a step outside its lease (G25)

CREATE TABLE agent_tenants (
    id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    name       text        NOT NULL,
    state      text        NOT NULL DEFAULT 'active',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_tenants_pkey PRIMARY KEY (id),
    -- G5: 'deleting' marks a tenant whose deletion policy is running (G17).
    CONSTRAINT agent_tenants_state_valid CHECK (state IN ('active', 'deleting')),
    CONSTRAINT agent_tenants_name_valid CHECK (length(name) BETWEEN 1 AND 200)
);

-- G15: a login role listed here is pinned to one tenant. Row-level security
-- trusts this table over the session setting agentdb.tenant_id, because any
-- session can SET a custom setting but only the schema owner writes this table.
-- Keyed by role name, not tenant: it is a lookup table (a Citus reference
-- table), not tenant-owned data.
CREATE TABLE agent_principals (
    role_name  text        NOT NULL,
    tenant_id  uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_principals_pkey PRIMARY KEY (role_name),
    CONSTRAINT agent_principals_tenant_fkey FOREIGN KEY (tenant_id)
        REFERENCES agent_tenants (id),
    CONSTRAINT agent_principals_role_name_valid CHECK (length(role_name) BETWEEN 1 AND 63)
);

-- G6: the allowed lifecycle edges. '(new)' is the pseudo-state a row is born
-- from. Edges are data so a team can read (and, as owner, extend) the graph;
-- the trigger agentdb_guard_transition refuses anything not listed.
CREATE TABLE agent_transitions (
    entity     text NOT NULL,
    from_state text NOT NULL,
    to_state   text NOT NULL,
    CONSTRAINT agent_transitions_pkey PRIMARY KEY (entity, from_state, to_state),
    CONSTRAINT agent_transitions_entity_valid CHECK (entity IN ('task', 'operation', 'outbox')),
    CONSTRAINT agent_transitions_no_self_loop CHECK (from_state <> to_state)
);

INSERT INTO agent_transitions (entity, from_state, to_state) VALUES
    -- tasks: pending/waiting are due when wake_at passes; running holds a lease.
    ('task', '(new)',    'pending'),
    ('task', '(new)',    'waiting'),
    ('task', 'pending',  'running'),
    ('task', 'pending',  'waiting'),
    ('task', 'pending',  'cancelled'),
    ('task', 'waiting',  'pending'),
    ('task', 'waiting',  'running'),
    ('task', 'waiting',  'cancelled'),
    ('task', 'running',  'pending'),
    ('task', 'running',  'waiting'),
    ('task', 'running',  'succeeded'),
    ('task', 'running',  'failed'),
    ('task', 'running',  'dead'),
    ('task', 'running',  'cancelled'),
    -- A due task whose attempts are used up (an operator lowered
    -- max_attempts, say) is buried by the claim path's maintenance.
    ('task', 'pending',  'dead'),
    ('task', 'waiting',  'dead'),
    -- operations: reserved is committed before the provider is called (G13);
    -- unknown means the call may have happened and must be reconciled.
    ('operation', '(new)',     'reserved'),
    ('operation', 'reserved',  'in_flight'),
    ('operation', 'reserved',  'succeeded'),
    ('operation', 'reserved',  'failed'),
    ('operation', 'reserved',  'unknown'),
    ('operation', 'in_flight', 'succeeded'),
    ('operation', 'in_flight', 'failed'),
    ('operation', 'in_flight', 'unknown'),
    ('operation', 'unknown',   'in_flight'),
    ('operation', 'unknown',   'succeeded'),
    ('operation', 'unknown',   'failed'),
    ('operation', 'failed',    'reserved'),
    -- outbox: dead rows can be replayed by an operator; delivered is final.
    ('outbox', '(new)',   'pending'),
    ('outbox', 'pending', 'delivered'),
    ('outbox', 'pending', 'dead'),
    ('outbox', 'dead',    'pending');

-- G16: which version of the OpenTelemetry GenAI semantic conventions the
-- application's spans followed, and since when. The spec is still evolving
-- and renames attributes; a reader of an old trace id looks up the version in
-- effect at the row's created_at. Append-only: a new pin is a new row.
-- Written by the owner at deploy time (agentdb.telemetry.pin_semconv).
CREATE TABLE agent_semconv_pins (
    since      timestamptz NOT NULL DEFAULT clock_timestamp(),
    version    text        NOT NULL,
    pinned_by  text        NOT NULL DEFAULT current_user,
    CONSTRAINT agent_semconv_pins_pkey PRIMARY KEY (since),
    CONSTRAINT agent_semconv_pins_version_format
        CHECK (version ~ '^[0-9]+\.[0-9]+(\.[0-9]+)?([-+][0-9A-Za-z.-]+)?$')
);

-- G15: the tenant the current session may see. A pinned login role wins over
-- the setting; an unpinned session (a trusted runtime that did SET LOCAL ROLE)
-- uses agentdb.tenant_id; otherwise NULL, which matches no row. PL/pgSQL, not
-- SQL: every agent-role policy calls it, and a SQL function carrying a SET
-- clause (the pinned search_path below) is never inlined, so it would parse
-- and plan its body again in every statement; PL/pgSQL keeps its plan for
-- the session.
CREATE FUNCTION agentdb_current_tenant() RETURNS uuid
    LANGUAGE plpgsql STABLE SECURITY DEFINER
AS $$
BEGIN
    RETURN coalesce(
        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),
        nullif(current_setting('agentdb.tenant_id', true), '')::uuid
    );
END
$$;

-- G15: scope the current transaction to one tenant (tenancy.tenant_scope).
-- A SET LOCAL statement, not set_config(): Citus sends SET statements on to
-- the workers' shard connections (with citus.propagate_set_commands =
-- 'local'), where the agent policies read the setting; set_config() stays
-- on the coordinator and the workers' policies would see no tenant. Anyone
-- may call it: it sets nothing a session could not set itself.
CREATE FUNCTION agentdb_scope_tenant(p_tenant uuid) RETURNS uuid
    LANGUAGE plpgsql
AS $$
BEGIN
    IF p_tenant IS NULL THEN
        RAISE EXCEPTION 'agentdb: tenant scope needs a tenant id' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        SET LOCAL citus.propagate_set_commands = 'local';
    END IF;
    EXECUTE format('SET LOCAL agentdb.tenant_id = %L', p_tenant);
    RETURN p_tenant;
END
$$;

-- Whether this schema's tables are distributed by Citus (false on plain
-- Postgres, where pg_dist_partition does not exist and is never read). The
-- runtime asks once per pool (agentdb/_citus), the rate-limit trigger on
-- every counted call (0009.budgets); agentdb_distribute() (0012.citus)
-- makes it true.
CREATE FUNCTION agentdb_distributed() RETURNS boolean
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM pg_catalog.pg_dist_partition p
        WHERE p.logicalrelid = 'agent_tasks'::regclass
    );
END
$$;

-- G6: refuse lifecycle moves that are not an edge in agent_transitions.
-- TG_ARGV[0] names the entity. Runs BEFORE INSERT OR UPDATE OF state.
CREATE FUNCTION agentdb_guard_transition() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    prior text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        prior := '(new)';
    ELSIF NEW.state IS NOT DISTINCT FROM OLD.state THEN
        RETURN NEW;
    ELSE
        prior := OLD.state;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM agent_transitions t
        WHERE t.entity = TG_ARGV[0] AND t.from_state = prior AND t.to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'agentdb: % may not move from % to %', TG_ARGV[0], prior, NEW.state
            USING ERRCODE = 'AG001', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G9: key names that must never appear in an audit payload, at any depth.
CREATE FUNCTION agentdb_is_secret_key(k text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT k ~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie)'
$$;

-- G9: values that look like credentials: provider API keys, bearer tokens,
-- JWTs, PEM private keys, AWS access keys, GitHub and Slack tokens.
CREATE FUNCTION agentdb_is_secret_value(v text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT v ~ '-----BEGIN [A-Z ]*PRIVATE KEY-----'
        OR v ~* '(^|[^A-Za-z0-9])bearer[[:space:]]+[A-Za-z0-9._~+/=-]{8,}'
        OR v ~ '(^|[^A-Za-z0-9])(sk|rk|pk)-[A-Za-z0-9_-]{16,}'
        OR v ~ '(^|[^A-Za-z0-9])AKIA[0-9A-Z]{16}'
        OR v ~ '(^|[^A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{30,}'
        OR v ~ '(^|[^A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}'
        OR v ~ '(^|[^A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.'
$$;

-- G9: true when, anywhere in the document, a key names a secret (and its
-- value is not the redaction mask "[redacted]") or a string looks like one.
-- Every event insert asks (agent_events_payload_no_secrets), so it first
-- tries one case-insensitive regex over the whole JSON text: a prefix or a
-- copy of every secret key and value pattern above, in characters JSON text
-- never escapes (the key pattern `(access|refresh|id|auth|session)[_-]?token`
-- in full, not the bare word `token`, so a payload naming the unit `tokens` -
-- every costed reservation of G19 - is not walked for nothing). Only a
-- document that matches is walked node by node. NULL (an erased payload) has
-- no secret. PL/pgSQL for the reason agentdb_current_tenant is.
CREATE FUNCTION agentdb_jsonb_has_secrets(doc jsonb) RETURNS boolean
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

-- A hint no guarantee rests on: wake idle workers and relays when work
-- arrives. Listeners also poll, so nothing depends on it arriving (it does
-- not behind a transaction-pooling proxy). Its triggers are statement-level:
-- one notification per statement, not per row, and Postgres folds identical
-- notifications within a transaction into one.
CREATE FUNCTION agentdb_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

-- G16: history that is only appended to; a wrong row is corrected by a newer one.
CREATE FUNCTION agentdb_refuse_change() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'agentdb: % is append-only', TG_TABLE_NAME
        USING ERRCODE = 'AG003', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

-- G16
CREATE TRIGGER agent_semconv_pins_append_only
    BEFORE UPDATE OR DELETE ON agent_semconv_pins
    FOR EACH ROW EXECUTE FUNCTION agentdb_refuse_change();

-- Pin every agentdb function's search_path to the schema it was created in,
-- followed by pg_temp. Without the explicit trailing pg_temp, Postgres searches
-- pg_temp first, and a session could shadow agent_transitions or
-- agent_principals with a temporary table of its own. The schema is only known
-- when the migration runs, hence the one dynamic statement, quoted with %I.
-- Every migration calls it last, for the routines it created.
CREATE PROCEDURE agentdb_pin_search_paths()
    LANGUAGE plpgsql
AS $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.proname LIKE 'agentdb\_%'
    LOOP
        EXECUTE format('ALTER ROUTINE %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_current_tenant() FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_pin_search_paths() FROM PUBLIC;

CALL agentdb_pin_search_paths();
