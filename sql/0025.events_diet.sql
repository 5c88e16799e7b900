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
-- event. One index insertion fewer per event.
--
-- The secret check (G9) called agentdb_jsonb_has_secrets for every event;
-- the call itself (a PL/pgSQL frame, its pinned search_path) cost more than
-- the case-insensitive regex the function starts with. The CHECK now runs
-- that regex inline and calls the function only for a payload it matches:
-- the same answer for every payload, as the function's own first step is
-- the same regex (tests/test_events_diet.py keeps the two texts equal).
--
-- Upgrading an install that holds events: the new keys are built first, under
-- other names, with the SHARE lock CREATE INDEX takes (event writes wait,
-- reads go on); the old indexes are then dropped and the new ones renamed,
-- and the check re-made NOT VALID (no scan) - those take ACCESS EXCLUSIVE
-- locks (reads wait too), held from there to the commit, a moment later.
-- 0025 and 0026 took 2.9 s together for 1.2 million events on the 2-core
-- development machine. 0026 validates the check in a transaction of its own
-- (SHARE UPDATE EXCLUSIVE: writes go on). Every row already passed the old,
-- equivalent check.

-- One event per task state_version (G8, renamed below to 0004's key); also the
-- task's event lookup.
CREATE UNIQUE INDEX agent_events_task_version_key_0025
    ON agent_events (tenant_id, task_id, task_state_version);
-- One event per operation state_version (G8, renamed below to 0004's key); also
-- the operation's event lookup (retention, tenant deletion).
CREATE UNIQUE INDEX agent_events_operation_version_key_0025
    ON agent_events (tenant_id, operation_id, operation_state_version)
    WHERE operation_id IS NOT NULL;
DROP INDEX agent_events_task_idx;
DROP INDEX agent_events_task_version_key;
ALTER INDEX agent_events_task_version_key_0025 RENAME TO agent_events_task_version_key;
DROP INDEX agent_events_operation_idx;
DROP INDEX agent_events_operation_version_key;
ALTER INDEX agent_events_operation_version_key_0025
    RENAME TO agent_events_operation_version_key;

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
