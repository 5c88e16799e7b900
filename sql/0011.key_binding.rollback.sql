-- Back to 0010: one SQLSTATE (AG004) for identity and key binding alike.
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

DELETE FROM agent_transitions
WHERE entity = 'task' AND to_state = 'dead' AND from_state IN ('pending', 'waiting');

DROP FUNCTION agentdb_schema_version();

CALL agentdb_pin_search_paths();
