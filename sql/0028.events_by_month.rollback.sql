-- Back to 0027: agent_events as one table, its rows copied out of the
-- partitions (a rewrite of the audit trail: ACCESS EXCLUSIVE for as long as
-- the copy takes), the one-event-per-version rule a unique index again.

ALTER TABLE agent_events RENAME TO agent_events_by_month;
ALTER INDEX agent_events_retain_until_idx RENAME TO agent_events_by_month_retain_until_idx;
ALTER INDEX agent_events_payload_expiry_idx RENAME TO agent_events_by_month_payload_expiry_idx;
-- (Dropped, not renamed: Citus cannot rename a distributed table's constraint.)
ALTER TABLE agent_events_by_month DROP CONSTRAINT agent_events_pkey;

-- A new id sequence, as 0028 made one (Citus cannot give a distributed
-- table's sequence another owner); it takes the old name once the old one
-- is gone with its table.
CREATE SEQUENCE agent_events_id_seq_0027 AS bigint;
SELECT setval('agent_events_id_seq_0027', s.last_value, s.is_called) FROM agent_events_id_seq s;

CREATE TABLE agent_events (
    LIKE agent_events_by_month INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
);
ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_0027');
ALTER SEQUENCE agent_events_id_seq_0027 OWNED BY agent_events.id;
CALL agentdb_distribute_like('agent_events_by_month', 'agent_events');
INSERT INTO agent_events SELECT * FROM agent_events_by_month;
-- G15: grants and policies go with the table, as 0028 moved them.
CALL agentdb_move_access('agent_events_by_month', 'agent_events', false);
DROP TABLE agent_events_by_month;
ALTER SEQUENCE agent_events_id_seq_0027 RENAME TO agent_events_id_seq;
DROP FUNCTION agentdb_event_partitions(integer);
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0027(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0027(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP PROCEDURE agentdb_distribute(integer);
ALTER PROCEDURE agentdb_distribute_0027(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_event_records_once();
DROP PROCEDURE agentdb_distribute_like(regclass, regclass);
DROP PROCEDURE agentdb_move_access(regclass, regclass, boolean);

ALTER TABLE agent_events ADD CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id);
ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
    REFERENCES agent_tasks (tenant_id, id);
ALTER TABLE agent_events ADD CONSTRAINT agent_events_operation_fkey
    FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_operations (tenant_id, id);
CREATE UNIQUE INDEX agent_events_task_version_key
    ON agent_events (tenant_id, task_id, task_state_version);
CREATE UNIQUE INDEX agent_events_operation_version_key
    ON agent_events (tenant_id, operation_id, operation_state_version)
    WHERE operation_id IS NOT NULL;
CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
    WHERE payload IS NOT NULL;
CREATE TRIGGER agent_events_append_only
    BEFORE UPDATE OR DELETE ON agent_events
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
CREATE TRIGGER agent_events_no_truncate
    BEFORE TRUNCATE ON agent_events
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

CREATE OR REPLACE FUNCTION agentdb_require_event() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.id
          AND e.task_state_version = NEW.state_version;
    ELSE
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.id
          AND e.operation_state_version = NEW.state_version;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agentdb: % % reached state_version % (%) without an event',
                TG_ARGV[0], NEW.id, NEW.state_version, NEW.state
            USING ERRCODE = 'AG006', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0027.call_instant'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
