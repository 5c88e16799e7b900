-- What a pool runs on each connection it opens (agentdb._db.pool).

-- name: pool_generic_plans :one
-- Plan each prepared statement of this session once: plan_cache_mode for the
-- rest of the session (no pool resets what it set). PostgreSQL otherwise
-- plans a statement afresh for its first five executions on each connection,
-- and then on every execution whose custom plan it prices below the generic
-- one - nearly every call of the batched statements and of most writes by
-- key. Not on a database with Citus installed: Citus cannot build a generic
-- distributed plan for a statement with parameters that reads many shards
-- ("could not create distributed plan", 0A000), so there the setting is left
-- as it was.
-- guarantee: none
-- zero rows: never (a SELECT without FROM returns one row)
-- params: none
SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
            THEN current_setting('plan_cache_mode')
            ELSE set_config('plan_cache_mode', 'force_generic_plan', false)
       END AS plan_cache_mode;
