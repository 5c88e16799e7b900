-- Back to 0004's secret check and 0004 / 0010's event indexes (built first,
-- under other names, as 0025 builds its own).
CREATE UNIQUE INDEX agent_events_task_version_key_0004
    ON agent_events (tenant_id, task_id, task_state_version)
    WHERE task_state_version IS NOT NULL;
CREATE INDEX agent_events_task_idx ON agent_events (tenant_id, task_id, id);
CREATE UNIQUE INDEX agent_events_operation_version_key_0004
    ON agent_events (tenant_id, operation_id, operation_state_version)
    WHERE operation_state_version IS NOT NULL;
CREATE INDEX agent_events_operation_idx ON agent_events (tenant_id, operation_id)
    WHERE operation_id IS NOT NULL;
DROP INDEX agent_events_task_version_key;
ALTER INDEX agent_events_task_version_key_0004 RENAME TO agent_events_task_version_key;
DROP INDEX agent_events_operation_version_key;
ALTER INDEX agent_events_operation_version_key_0004
    RENAME TO agent_events_operation_version_key;

ALTER TABLE agent_events DROP CONSTRAINT agent_events_payload_no_secrets;
ALTER TABLE agent_events ADD CONSTRAINT agent_events_payload_no_secrets
    CHECK (NOT agentdb_jsonb_has_secrets(payload));

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0024.plpgsql_checks'::text $$;

CALL agentdb_pin_search_paths();
