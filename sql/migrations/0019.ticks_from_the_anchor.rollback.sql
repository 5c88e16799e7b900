-- Back to 0018: a time before the anchor is NULL again, not false.
CREATE OR REPLACE FUNCTION agentdb_schedule_is_tick(p_every interval, p_cron text,
                                                    p_anchor timestamptz, p_at timestamptz)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT agentdb_schedule_tick(p_every, p_cron, p_anchor, p_at, false) = p_at
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0018.room_to_update'::text $$;

CALL agentdb_pin_search_paths();
