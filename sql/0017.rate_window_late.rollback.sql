-- Back to 0016: 0014's count (a call that waited past its window is counted
-- in the next one).
CREATE OR REPLACE FUNCTION agentdb_count_call() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    lim record;
    step record;
    over text;
BEGIN
    SELECT r.per, r.window_start, r.used, r.max_calls INTO lim FROM agent_rate_limits r
    WHERE r.tenant_id = NEW.tenant_id AND r.action = NEW.action FOR UPDATE;
    IF FOUND THEN
        step := agentdb_rate_step(lim.per, lim.window_start, lim.used);
        IF step.used > lim.max_calls THEN
            over := format('tenant %s: %s per %s', NEW.tenant_id, lim.max_calls, lim.per);
        ELSE
            UPDATE agent_rate_limits r
            SET used = step.used, window_start = step.window_start, updated_at = now()
            WHERE r.tenant_id = NEW.tenant_id AND r.action = NEW.action;
        END IF;
    END IF;
    IF over IS NULL AND NOT agentdb_distributed() THEN
        SELECT g.per, g.window_start, g.used, g.max_calls INTO lim FROM agent_global_rate_limits g
        WHERE g.action = NEW.action FOR UPDATE;
        IF FOUND THEN
            step := agentdb_rate_step(lim.per, lim.window_start, lim.used);
            IF step.used > lim.max_calls THEN
                over := format('global: %s per %s', lim.max_calls, lim.per);
            ELSE
                UPDATE agent_global_rate_limits g
                SET used = step.used, window_start = step.window_start, updated_at = now()
                WHERE g.action = NEW.action;
            END IF;
        END IF;
    END IF;
    IF over IS NOT NULL THEN
        RAISE EXCEPTION 'agentdb: % used up its rate limit (%)', NEW.action, over
            USING ERRCODE = 'AG011', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- Citus: the trigger updates agent_rate_limits from inside a shard's insert (see 0014).
DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_count_call() SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0016.secret_prefilter'::text $$;

CALL agentdb_pin_search_paths();
