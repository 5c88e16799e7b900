-- 0027 call instant: a call is counted at the instant its operation row
-- carries, which on Citus is the coordinator's, not the worker's (G19).
-- depends: 0026.events_diet_validate
-- phase: expand
--
-- 0014/0017 count a call in the window holding now(), the transaction's
-- start, the instant the operation's row and its event carry. On Citus
-- those differ: the coordinator evaluates now() in the statements it routes
-- (created_at, updated_at and the event's created_at are its transaction
-- start), while the trigger runs on the worker, whose transaction begins
-- when the coordinator first reaches it - later, by as long as the caller's
-- transaction waited before reserving. A call whose coordinator transaction
-- began in one window and reached the worker in the next was counted in the
-- new window while its event lies in the old one (what 0017 refuses on
-- plain Postgres). Now the instant is least(now(), the row's own stamp):
-- created_at on insert, updated_at on a re-arm that sets it. On plain
-- Postgres both are now(). A writer can move the instant only earlier than
-- now(), which never starts a window: it is counted in the current one or,
-- before it, refused as late.
--
-- CREATE OR REPLACE drops the function's settings; on a distributed schema
-- the one agentdb_distribute() (0014) gives it is set again here.

-- G19
CREATE FUNCTION agentdb_rate_step(p_per interval, p_start timestamptz, p_used integer,
                                  p_at timestamptz,
                                  OUT used integer, OUT window_start timestamptz)
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_start + p_per <= p_at THEN
        used := 1;
        window_start := date_bin(p_per, p_at, timestamptz '2000-01-01 00:00:00+00');
    ELSE
        used := p_used + 1;
        window_start := p_start;
    END IF;
END
$$;

-- G19
CREATE OR REPLACE FUNCTION agentdb_count_call() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    lim record;
    step record;
    over text;
    at timestamptz := now();
BEGIN
    IF TG_OP = 'INSERT' THEN
        at := least(at, NEW.created_at);
    ELSIF NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
        at := least(at, NEW.updated_at);
    END IF;
    SELECT r.per, r.window_start, r.used, r.max_calls INTO lim FROM agent_rate_limits r
    WHERE r.tenant_id = NEW.tenant_id AND r.action = NEW.action FOR UPDATE;
    IF FOUND AND at < lim.window_start AND clock_timestamp() >= lim.window_start THEN
        over := format('tenant %s: %s per %s; the transaction began before the current window',
                       NEW.tenant_id, lim.max_calls, lim.per);
    ELSIF FOUND THEN
        step := agentdb_rate_step(lim.per, lim.window_start, lim.used, at);
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
        IF FOUND AND at < lim.window_start AND clock_timestamp() >= lim.window_start THEN
            over := format('global: %s per %s; the transaction began before the current window',
                           lim.max_calls, lim.per);
        ELSIF FOUND THEN
            step := agentdb_rate_step(lim.per, lim.window_start, lim.used, at);
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

-- 0014's three-argument step read now() itself; nothing calls it any more.
DROP FUNCTION agentdb_rate_step(interval, timestamptz, integer);

DO $$
BEGIN
    IF agentdb_distributed() THEN
        ALTER FUNCTION agentdb_count_call() SET citus.allow_nested_distributed_execution = on;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0027.call_instant'::text $$;

CALL agentdb_pin_search_paths();
