-- Back to 0025's check as 0025 left it: the same definition, NOT VALID
-- (PostgreSQL cannot mark a validated constraint unvalidated).
ALTER TABLE agent_events DROP CONSTRAINT agent_events_payload_no_secrets;
ALTER TABLE agent_events ADD CONSTRAINT agent_events_payload_no_secrets
    CHECK (payload::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|sk-|rk-|pk-|AKIA|gh[pousr]_|xox[abprs]-|eyJ)'
           OR NOT agentdb_jsonb_has_secrets(payload))
    NOT VALID;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0025.events_diet'::text $$;

CALL agentdb_pin_search_paths();
