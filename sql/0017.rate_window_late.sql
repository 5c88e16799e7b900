-- 0017 rate window late: a call whose transaction began in a window that
-- has since been replaced is refused, not counted in the new one (G19).
-- depends: 0016.secret_prefilter
-- phase: expand
--
-- 0014 counts a call in the window holding now(), the transaction's start,
-- which is also the instant its operation.reserved event carries. But the
-- count is read under the limit's row lock, and a transaction that began
-- just before a window ended can get that lock only after a later one has
-- started the next window. 0014 then counted it in the new window while its
-- event lies in the old one: measured from the events, the old window held
-- up to twice its limit (three workers, 5 per second: 9 in one second). The
-- old window's count is gone by then, so whether it had room is unknown:
-- the call is refused (AG011, as any call over the limit) and its retry, a
-- new transaction, is counted where its own event will lie. The window has
-- room by then, so agentdb.budgets reports "retry at once". (A window that
-- starts after clock_timestamp() can only come from a clock that stepped
-- back: such a call is counted in it, as before, rather than refused until
-- the clock catches up.)
--
-- CREATE OR REPLACE drops the function's settings; on a distributed schema
-- the one agentdb_distribute() (0014) gives it is set again here.

-- G19
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
AS $$ SELECT '0017.rate_window_late'::text $$;

CALL agentdb_pin_search_paths();
