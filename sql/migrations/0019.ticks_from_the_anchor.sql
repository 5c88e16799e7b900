-- 0019 ticks from the anchor: a time before a schedule's anchor is not one of
-- its ticks (G24).
-- depends: 0018.room_to_update
-- phase: expand
--
-- * agentdb_schedule_is_tick compared agentdb_schedule_tick(..., false) with
--   p_at, and that tick is NULL for a time before the anchor (no tick of the
--   rule is at or before it). NULL = p_at is NULL, and a CHECK passes on
--   NULL: agent_schedules_next_tick_valid took a next_tick_at before the
--   anchor, and the tick guard (IF ... OR NOT is_tick THEN raise) let a task
--   claim such a tick. Found by tests/test_check_edges.py, which pins each
--   CHECK at its edges (issue 35).
-- * The function now says false where it said NULL - for a schedule with one
--   rule. Without a rule, or with both, it still says NULL: the row is
--   refused all the same, by agent_schedules_one_rule, which names the
--   reason (of two CHECKs that fail, Postgres reports the first by name, and
--   next_tick_valid comes before one_rule). Rows written before this
--   migration are not checked again; agentdb itself never wrote such a row
--   (a schedule's first tick is computed forward from its anchor).

-- G24: whether p_at is a tick of the rule: false, not NULL, for any time that is
-- not (a CHECK passes on NULL); NULL only when there is not exactly one rule.
CREATE OR REPLACE FUNCTION agentdb_schedule_is_tick(p_every interval, p_cron text,
                                                    p_anchor timestamptz, p_at timestamptz)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN (p_every IS NULL) <> (p_cron IS NULL)
                THEN coalesce(agentdb_schedule_tick(p_every, p_cron, p_anchor, p_at, false) = p_at,
                              false)
           END
$$;

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0019.ticks_from_the_anchor'::text $$;

CALL agentdb_pin_search_paths();
