-- Back to 0026: 0017's count at the worker's now(), 0014's three-argument step.
CREATE FUNCTION agentdb_rate_step(p_per interval, p_start timestamptz, p_used integer,
                                  OUT used integer, OUT window_start timestamptz)
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_start + p_per <= now() THEN
        used := 1;
        window_start := date_bin(p_per, now(), timestamptz '2000-01-01 00:00:00+00');
    ELSE
        used := p_used + 1;
        window_start := p_start;
    END IF;
END
$$;

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
    IF FOUND AND now() < lim.window_start AND clock_timestamp() >= lim.window_start THEN
        over := format('tenant %s: %s per %s; the transaction began before the current window',
                       NEW.tenant_id, lim.max_calls, lim.per);
    ELSIF FOUND THEN
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
        IF FOUND AND now() < lim.window_start AND clock_timestamp() >= lim.window_start THEN
            over := format('global: %s per %s; the transaction began before the current window',
                           lim.max_calls, lim.per);
        ELSIF FOUND THEN
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

DROP FUNCTION agentdb_rate_step(interval, timestamptz, integer, timestamptz);

DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_count_call() SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0026.events_diet_validate'::text $$;

CALL agentdb_pin_search_paths();
