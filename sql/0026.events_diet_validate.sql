-- 0026 events diet, validated: 0025's secret check holds for every existing row.
-- depends: 0025.events_diet
-- phase: expand
--
-- A transaction of its own: VALIDATE CONSTRAINT takes a SHARE UPDATE
-- EXCLUSIVE lock, so events are written while it reads the table (0025's
-- ACCESS EXCLUSIVE lock is gone by now). It cannot fail on rows 0004's
-- check accepted: the two checks give the same answer for every payload.

-- G9
ALTER TABLE agent_events VALIDATE CONSTRAINT agent_events_payload_no_secrets;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0026.events_diet_validate'::text $$;

CALL agentdb_pin_search_paths();
