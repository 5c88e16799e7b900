-- 0001 foundation: tenants, principals pinned to a tenant, the lifecycle
-- transition table, and the guard functions every later migration uses.
-- phase: expand
--
-- Every object is created unqualified, in the first schema of the search_path,
-- so this file can be applied into any schema (agentdb migrate --schema, or
-- agentdb sql --schema) and pasted into an existing database.
--
-- Guards raise their own SQLSTATEs (class AG) and name the trigger in the
-- CONSTRAINT field, so callers map errors without reading message text:
--   AG001 invalid transition (G6)        AG004 immutable column (G2)
--   AG002 state_version rule (G7)        AG005 lease token regression (G12)
--   AG003 append-only audit log (G8)     AG006 state change without event (G8)
--   AG007 no tenant scope for the session (G15)

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

-- G15: the tenant the current session may see. A pinned login role wins over
-- the setting; an unpinned session (a trusted runtime that did SET LOCAL ROLE)
-- uses agentdb.tenant_id; otherwise NULL, which matches no row.
CREATE FUNCTION agentdb_current_tenant() RETURNS uuid
    LANGUAGE sql STABLE SECURITY DEFINER
AS $$
    SELECT coalesce(
        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),
        nullif(current_setting('agentdb.tenant_id', true), '')::uuid
    )
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

-- G7 + G2 + G4 + G12: versioned rows. TG_ARGV[0] is 'task' or 'operation'.
-- Every UPDATE moves state_version by exactly +1, except a lease heartbeat
-- that changes nothing but lease_expires_at and updated_at (so renewing does
-- not invalidate other writers' expectations) and an UPDATE that changes
-- nothing at all. Identity never changes:
-- tenant_id (Citus cannot update it), id, created_at, and what a key was
-- issued for (a task's type, dedupe key and input hash; an operation's task,
-- idempotency key, action and input hash) - otherwise a stored result could
-- be re-pointed at a different request (G4). Lease tokens never go backwards
-- and every new lease grant takes a new token (G12).
-- Table-specific checks are nested IFs: PL/pgSQL resolves every NEW.column in
-- an expression, so a column the other table lacks must not be reached.
CREATE FUNCTION agentdb_guard_version() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    probe record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state_version <> 0 THEN
            RAISE EXCEPTION 'agentdb: a new % row starts at state_version 0, not %', TG_TABLE_NAME, NEW.state_version
                USING ERRCODE = 'AG002', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id
       OR NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.input_hash IS DISTINCT FROM OLD.input_hash THEN
        RAISE EXCEPTION 'agentdb: the identity columns of % are immutable', TG_TABLE_NAME
            USING ERRCODE = 'AG004', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        IF NEW.task_type IS DISTINCT FROM OLD.task_type
           OR NEW.dedupe_key IS DISTINCT FROM OLD.dedupe_key THEN
            RAISE EXCEPTION 'agentdb: the identity columns of % are immutable', TG_TABLE_NAME
                USING ERRCODE = 'AG004', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
        IF NEW.lease_token < OLD.lease_token
           OR (NEW.lease_owner IS NOT NULL
               AND (OLD.lease_owner IS NULL
                    OR NEW.lease_owner <> OLD.lease_owner
                    OR NEW.lease_acquired_at <> OLD.lease_acquired_at)
               AND NEW.lease_token <= OLD.lease_token) THEN
            RAISE EXCEPTION 'agentdb: lease token of % must grow with every new lease (% -> %)',
                    TG_TABLE_NAME, OLD.lease_token, NEW.lease_token
                USING ERRCODE = 'AG005', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    ELSE
        IF NEW.task_id IS DISTINCT FROM OLD.task_id
           OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
           OR NEW.action IS DISTINCT FROM OLD.action THEN
            RAISE EXCEPTION 'agentdb: the identity columns of % are immutable', TG_TABLE_NAME
                USING ERRCODE = 'AG004', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
        END IF;
    END IF;
    IF NEW.state_version = OLD.state_version + 1 THEN
        RETURN NEW;
    END IF;
    -- Same version: allowed only if nothing but the heartbeat columns changed
    -- (an UPDATE that changes nothing at all included).
    IF NEW.state_version = OLD.state_version THEN
        probe := NEW;
        probe.updated_at := OLD.updated_at;
        IF TG_ARGV[0] = 'task' THEN
            probe.lease_expires_at := OLD.lease_expires_at;
        END IF;
        IF probe IS NOT DISTINCT FROM OLD THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'agentdb: % state_version must move by exactly +1 (% -> %)',
            TG_TABLE_NAME, OLD.state_version, NEW.state_version
        USING ERRCODE = 'AG002', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
END
$$;

-- Pin every agentdb function's search_path to the schema it was created in,
-- followed by pg_temp. Without the explicit trailing pg_temp, Postgres searches
-- pg_temp first, and a session could shadow agent_transitions or
-- agent_principals with a temporary table of its own. The schema is only known
-- when the migration runs, hence the one dynamic statement, quoted with %I.
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
