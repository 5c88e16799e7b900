-- 0011 key binding: the version guards tell a rebound key (G4) from a changed
-- identity (G2), exhausted due tasks can be buried, and the schema says which
-- migration it is at.
-- depends: 0010.retention
-- phase: expand
--
-- Until now one SQLSTATE (AG004) refused both a changed tenant_id / id /
-- created_at and a changed input_hash / dedupe key / action. They protect
-- different guarantees: identity (G2), and what a key was issued for (G4: a
-- stored result must never be re-pointed at a different request). The guard
-- now raises AG008 for the second, so the error - and the guarantee it
-- carries - says which rule refused the write. Nothing that was allowed
-- before is refused now, and nothing refused before is allowed.
--
-- A due task whose attempts are used up (an operator lowered max_attempts,
-- say) is buried by the claim path's maintenance: the graph now has the two
-- edges that move takes, pending -> dead and waiting -> dead (G6).
--
-- agentdb_schema_version() names the newest migration applied. Every later
-- migration replaces it, so a worker or relay can refuse to start on a
-- schema older than the code (agentdb.schema.check).

-- G7 + G2 + G4 + G12: versioned rows. TG_ARGV[0] is 'task' or 'operation'.
-- Every UPDATE moves state_version by exactly +1, except a lease heartbeat
-- that changes nothing but lease_expires_at and updated_at (so renewing does
-- not invalidate other writers' expectations) and an UPDATE that changes
-- nothing at all. Identity never changes (AG004, G2): tenant_id (Citus
-- cannot update it), id, created_at. What a key was issued for never changes
-- (AG008, G4): a task's type, dedupe key and input hash; an operation's
-- task, idempotency key, action and input hash. Lease tokens never go
-- backwards and every new lease grant takes a new token (AG005, G12).
-- Table-specific checks are nested IFs: PL/pgSQL resolves every NEW.column in
-- an expression, so a column the other table lacks must not be reached.
CREATE OR REPLACE FUNCTION agentdb_guard_version() RETURNS trigger
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
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'agentdb: the identity columns of % are immutable', TG_TABLE_NAME
            USING ERRCODE = 'AG004', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.input_hash IS DISTINCT FROM OLD.input_hash THEN
        RAISE EXCEPTION 'agentdb: the input_hash of a % row is bound to its key', TG_TABLE_NAME
            USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        IF NEW.task_type IS DISTINCT FROM OLD.task_type
           OR NEW.dedupe_key IS DISTINCT FROM OLD.dedupe_key THEN
            RAISE EXCEPTION 'agentdb: the dedupe key and task type of % are bound to its request', TG_TABLE_NAME
                USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
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
            RAISE EXCEPTION 'agentdb: the task, idempotency key and action of % are bound to its key', TG_TABLE_NAME
                USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
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

INSERT INTO agent_transitions (entity, from_state, to_state) VALUES
    ('task', 'pending', 'dead'),
    ('task', 'waiting', 'dead');

-- The newest migration this schema has; replaced by every later migration.
CREATE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0011.key_binding'::text $$;

CALL agentdb_pin_search_paths();
