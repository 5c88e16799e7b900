-- 0025 events diet: every state change writes an event (G8), so the event
-- insert is on every write path; the same guarantees for less work per row.
-- depends: 0024.plpgsql_checks
-- phase: expand
--
-- Two indexes of agent_events only repeated a prefix of a unique key:
-- agent_events_task_idx (tenant_id, task_id, id) beside the one-event-per-
-- version key (tenant_id, task_id, task_state_version), and
-- agent_events_operation_idx (tenant_id, operation_id) beside the
-- operation's. Each unique key now covers every row of its task / operation
-- (NULL versions are distinct, so the rule is unchanged: at most one event
-- per recorded version) and serves the lookups the others served: the
-- foreign-key checks of a task or operation delete, the deferred event
-- check, a task's events in order (a small sort), a child's finishing
-- event. Two index insertions fewer per operation event, one per task event.
--
-- The secret check (G9) called agentdb_jsonb_has_secrets for every event;
-- the call itself (a PL/pgSQL frame, its pinned search_path) cost more than
-- the case-insensitive regex the function starts with. The CHECK now runs
-- that regex inline and calls the function only for a payload it matches:
-- the same answer for every payload, as the function's own first step is
-- the same regex (tests/test_events_diet.py keeps the two texts equal).
--
-- Both steps hold agent_events' locks until the migration commits: the
-- index builds block event writes (not reads) while they run (0025 and 0026
-- took 2.9 s together for 1.2 million events on the 2-core development
-- machine). The constraint is added NOT VALID, which scans nothing; 0026
-- validates it in its own transaction, letting writes through meanwhile.
-- Every row already passed the old, equivalent check.

-- G8: one event per task state_version; also the task's event lookup.
DROP INDEX agent_events_task_idx;
DROP INDEX agent_events_task_version_key;
CREATE UNIQUE INDEX agent_events_task_version_key
    ON agent_events (tenant_id, task_id, task_state_version);

-- G8: one event per operation state_version; also the operation's event lookup
-- (retention, tenant deletion).
DROP INDEX agent_events_operation_idx;
DROP INDEX agent_events_operation_version_key;
CREATE UNIQUE INDEX agent_events_operation_version_key
    ON agent_events (tenant_id, operation_id, operation_state_version)
    WHERE operation_id IS NOT NULL;

-- G9: bounded, redacted payloads - the function only for a payload the
-- prefilter matches (the regex is agentdb_jsonb_has_secrets's first step).
ALTER TABLE agent_events DROP CONSTRAINT agent_events_payload_no_secrets;
ALTER TABLE agent_events ADD CONSTRAINT agent_events_payload_no_secrets
    CHECK (payload::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)'
           OR NOT agentdb_jsonb_has_secrets(payload))
    NOT VALID;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0025.events_diet'::text $$;

CALL agentdb_pin_search_paths();
