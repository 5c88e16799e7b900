-- 0014 budgets: spend budgets and provider rate limits, refused by the
-- database at reserve (G19).
-- depends: 0013.citus
-- phase: expand
--
-- A budget is a limit in a named unit ('tokens', 'usd_micros', ...) for a
-- tenant, or for one task of a tenant, over a window (the whole life of the
-- budget, a UTC day or a UTC month). operations.reserve(..., cost=...) holds
-- the estimate on every budget of that unit in the same statement as the
-- operation (agentdb/queries/operations.sql, operation_reserve); the
-- CHECK agent_budgets_within_limit refuses a hold that would take spent +
-- held over the limit, so no writer - the runtime, a migration, hand-typed
-- SQL - can overspend. Settling the operation moves its holds: succeeded
-- spends the actual amount (never more than the hold: the estimate is the
-- ceiling, like a max_tokens) and releases the rest; failed releases all;
-- unknown keeps the hold until it is reconciled.
--
-- A rate limit allows max_calls operations of one action per window of
-- `per`, per tenant (agent_rate_limits) or across tenants
-- (agent_global_rate_limits). The windows are aligned (date_bin from
-- 2000-01-01 UTC), so "at most N per window" can be checked afterwards from
-- the events' timestamps. A trigger counts every new operation and every
-- re-armed retry of a failed one, whoever writes it; the CHECK
-- trigger refuses the call over the limit (AG011), with the CHECK
-- agent_rate_limits_within_limit behind it.
--
-- On Citus every table here is distributed by tenant, colocated with the
-- tenant's tasks and operations, so a reservation with its holds and its
-- rate-limit count is one single-shard transaction. A global limit is one
-- row every tenant's reservation would have to lock; on Citus that is a
-- reference table written from every shard, i.e. a two-phase commit per
-- reservation, so there are no global limits on a distributed schema:
-- agentdb_distribute() refuses while one exists and the table refuses new
-- rows afterwards (set one per tenant instead).

-- G19: what a tenant (task_id NULL) or one task may spend, per unit.
CREATE TABLE agent_budgets (
    tenant_id    uuid        NOT NULL,
    id           uuid        NOT NULL DEFAULT gen_random_uuid(),
    task_id      uuid,
    unit         text        NOT NULL,
    period       text        NOT NULL DEFAULT 'total',
    limit_amount bigint      NOT NULL,
    spent        bigint      NOT NULL DEFAULT 0,
    held         bigint      NOT NULL DEFAULT 0,
    -- Start of the current window ('-infinity' for 'total', and before the
    -- first write of a day or month budget); maintained by agent_budgets_guard.
    window_start timestamptz NOT NULL DEFAULT '-infinity',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_budgets_pkey PRIMARY KEY (tenant_id, id),
    -- G19: one budget per (tenant, task or none, unit).
    CONSTRAINT agent_budgets_scope_key UNIQUE NULLS NOT DISTINCT (tenant_id, task_id, unit),
    -- G2: a budget names a tenant, and a task of that tenant.
    CONSTRAINT agent_budgets_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    CONSTRAINT agent_budgets_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id),
    -- G19
    CONSTRAINT agent_budgets_unit_valid CHECK (unit ~ '^[a-z][a-z0-9_]{0,62}$'),
    CONSTRAINT agent_budgets_period_valid CHECK (period IN ('total', 'day', 'month')),
    CONSTRAINT agent_budgets_amounts_valid CHECK (limit_amount >= 0 AND spent >= 0 AND held >= 0),
    CONSTRAINT agent_budgets_within_limit CHECK (spent + held <= limit_amount)
);

-- G19: one operation attempt's hold on one budget. 'held' while the outcome
-- is open (reserved, in flight, unknown); 'settled' with what was spent, or
-- 'released' when the effect did not happen. The hold of every attempt is
-- kept: the books are the holds.
CREATE TABLE agent_budget_holds (
    tenant_id    uuid        NOT NULL,
    operation_id uuid        NOT NULL,
    attempt      integer     NOT NULL,
    budget_id    uuid        NOT NULL,
    unit         text        NOT NULL,
    amount       bigint      NOT NULL,
    settled      bigint,
    state        text        NOT NULL DEFAULT 'held',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_budget_holds_pkey PRIMARY KEY (tenant_id, operation_id, attempt, budget_id),
    -- G2
    CONSTRAINT agent_budget_holds_operation_fkey FOREIGN KEY (tenant_id, operation_id)
        REFERENCES agent_operations (tenant_id, id),
    CONSTRAINT agent_budget_holds_budget_fkey FOREIGN KEY (tenant_id, budget_id)
        REFERENCES agent_budgets (tenant_id, id),
    -- G19
    CONSTRAINT agent_budget_holds_amount_valid CHECK (amount >= 0 AND attempt >= 1),
    CONSTRAINT agent_budget_holds_state_valid CHECK (state IN ('held', 'settled', 'released')),
    CONSTRAINT agent_budget_holds_settled_valid
        CHECK ((state = 'settled') = (settled IS NOT NULL) AND settled BETWEEN 0 AND amount)
);

-- G2: serves the foreign key from holds to budgets, and a budget's books.
CREATE INDEX agent_budget_holds_budget_idx ON agent_budget_holds (tenant_id, budget_id);

-- G19: at most max_calls operations of one action per window of `per`, per tenant.
CREATE TABLE agent_rate_limits (
    tenant_id    uuid        NOT NULL,
    action       text        NOT NULL,
    max_calls    integer     NOT NULL,
    per          interval    NOT NULL,
    window_start timestamptz NOT NULL DEFAULT '-infinity',
    used         integer     NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_rate_limits_pkey PRIMARY KEY (tenant_id, action),
    -- G2
    CONSTRAINT agent_rate_limits_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    -- G19
    CONSTRAINT agent_rate_limits_action_valid CHECK (length(action) BETWEEN 1 AND 200),
    CONSTRAINT agent_rate_limits_per_valid
        CHECK (per > interval '0' AND date_part('month', per) = 0 AND date_part('year', per) = 0),
    CONSTRAINT agent_rate_limits_used_valid CHECK (max_calls >= 0 AND used >= 0),
    CONSTRAINT agent_rate_limits_within_limit CHECK (used <= max_calls)
);

-- G19: the same across every tenant (plain Postgres only; see the header).
CREATE TABLE agent_global_rate_limits (
    action       text        NOT NULL,
    max_calls    integer     NOT NULL,
    per          interval    NOT NULL,
    window_start timestamptz NOT NULL DEFAULT '-infinity',
    used         integer     NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_global_rate_limits_pkey PRIMARY KEY (action),
    -- G19
    CONSTRAINT agent_global_rate_limits_action_valid CHECK (length(action) BETWEEN 1 AND 200),
    CONSTRAINT agent_global_rate_limits_per_valid
        CHECK (per > interval '0' AND date_part('month', per) = 0 AND date_part('year', per) = 0),
    CONSTRAINT agent_global_rate_limits_used_valid CHECK (max_calls >= 0 AND used >= 0),
    CONSTRAINT agent_global_rate_limits_within_limit CHECK (used <= max_calls)
);

-- G19: a budget's window rolls over on its first write in a new day or
-- month (spent starts again from 0; what is held stays held). Inside a
-- window spent never goes down and the window never goes back: a refund
-- would be an overspend by another name (AG010).
CREATE FUNCTION agentdb_guard_budget() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    current_window timestamptz;
BEGIN
    IF NEW.period = 'total' THEN
        current_window := '-infinity';
    ELSE
        current_window := date_trunc(NEW.period, now(), 'UTC');
    END IF;
    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id
       OR NEW.unit IS DISTINCT FROM OLD.unit OR NEW.task_id IS DISTINCT FROM OLD.task_id THEN
        RAISE EXCEPTION 'agentdb: a budget''s tenant, id, task and unit never change'
            USING ERRCODE = 'AG010', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    -- Switching the period would start a new window: a refund by another name.
    IF NEW.period IS DISTINCT FROM OLD.period AND (OLD.spent > 0 OR OLD.held > 0) THEN
        RAISE EXCEPTION 'agentdb: budget % has % spent and % held; its period changes only '
                        'while both are 0', NEW.id, OLD.spent, OLD.held
            USING ERRCODE = 'AG010', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.period IS DISTINCT FROM OLD.period OR OLD.window_start < current_window THEN
        -- A new window (or a new kind of window): spending starts again.
        IF NEW.spent IS NOT DISTINCT FROM OLD.spent THEN
            NEW.spent := 0;
        ELSE
            NEW.spent := NEW.spent - OLD.spent;
        END IF;
        NEW.window_start := current_window;
    ELSIF NEW.spent < OLD.spent OR NEW.window_start IS DISTINCT FROM OLD.window_start THEN
        RAISE EXCEPTION 'agentdb: budget % spent % of % in this window; spent never goes down',
                NEW.id, OLD.spent, NEW.unit
            USING ERRCODE = 'AG010', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G19: only the writes it has something to do for call it: a plain hold or
-- settlement of a 'total' budget costs no function call (the reserve path).
CREATE TRIGGER agent_budgets_guard
    BEFORE UPDATE ON agent_budgets
    FOR EACH ROW
    WHEN (NEW.period <> 'total' OR OLD.period <> 'total' OR NEW.spent < OLD.spent
          OR NEW.window_start IS DISTINCT FROM OLD.window_start
          OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id
          OR NEW.unit IS DISTINCT FROM OLD.unit OR NEW.task_id IS DISTINCT FROM OLD.task_id)
    EXECUTE FUNCTION agentdb_guard_budget();

-- G19: a hold is written once and settled once: what it holds, for which
-- operation attempt and budget, never changes, and a settled or released
-- hold is final (AG010). Otherwise a released hold could be "re-held" to
-- hide a spend, or a settled one released to refund it.
CREATE FUNCTION agentdb_guard_budget_hold() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.state <> 'held'
       OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.operation_id IS DISTINCT FROM OLD.operation_id
       OR NEW.attempt IS DISTINCT FROM OLD.attempt
       OR NEW.budget_id IS DISTINCT FROM OLD.budget_id
       OR NEW.unit IS DISTINCT FROM OLD.unit
       OR NEW.amount IS DISTINCT FROM OLD.amount THEN
        RAISE EXCEPTION 'agentdb: hold of operation % on budget % is % and cannot change',
                OLD.operation_id, OLD.budget_id, OLD.state
            USING ERRCODE = 'AG010', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

-- G19
CREATE TRIGGER agent_budget_holds_guard
    BEFORE UPDATE ON agent_budget_holds
    FOR EACH ROW EXECUTE FUNCTION agentdb_guard_budget_hold();

-- G19: one more call of a rate limit now (a window of p_per from p_start
-- with p_used calls): the calls its window then holds, and the window's
-- start (a window that has passed starts again at the aligned bin of now()).
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

-- G19: count one call of NEW.action against its rate limits: the tenant's
-- and (not on Citus: see the header) the global one, in the window that
-- holds now(), the transaction's start - the same instant the operation's
-- event carries. Each limit is read under its row lock, stepped
-- (agentdb_rate_step) and written back as constants: Citus refuses now()
-- inside a CASE of a distributed UPDATE. A limit with no room left is not
-- written, and the call is refused (AG011, naming this trigger) and with it
-- the operation; the CHECK agent_rate_limits_within_limit stands behind it
-- for any other writer of the counters.
CREATE FUNCTION agentdb_count_call() RETURNS trigger
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

-- G19: a new operation is a call; so is the re-armed retry of a failed one.
CREATE TRIGGER agent_operations_rate_limit
    AFTER INSERT ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_count_call();
-- G19
CREATE TRIGGER agent_operations_rate_limit_retry
    AFTER UPDATE OF state ON agent_operations
    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')
    EXECUTE FUNCTION agentdb_count_call();

ALTER TABLE agent_budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budgets FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_budgets_owner_all ON agent_budgets
    TO CURRENT_USER USING (true) WITH CHECK (true);
ALTER TABLE agent_budget_holds ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_budget_holds FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_budget_holds_owner_all ON agent_budget_holds
    TO CURRENT_USER USING (true) WITH CHECK (true);
ALTER TABLE agent_rate_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_rate_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY agent_rate_limits_owner_all ON agent_rate_limits
    TO CURRENT_USER USING (true) WITH CHECK (true);

-- The grants of 0012 (kept as agentdb_grant_roles_0012), then the budget
-- tables'. The runtime holds and settles (UPDATE) and may set budgets and
-- limits (INSERT, UPDATE); it never deletes them. Agents see none of it:
-- budgets are the operator's, like the caps.
ALTER PROCEDURE agentdb_grant_roles() RENAME TO agentdb_grant_roles_0012;
CREATE PROCEDURE agentdb_grant_roles()
    LANGUAGE plpgsql
AS $$
DECLARE
    tbl text;
BEGIN
    CALL agentdb_grant_roles_0012();
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        GRANT SELECT, INSERT, UPDATE ON agent_budgets, agent_budget_holds, agent_rate_limits,
                                        agent_global_rate_limits TO agentdb_runtime;
        PERFORM set_config('client_min_messages', 'warning', true);
        FOREACH tbl IN ARRAY ARRAY['agent_budgets', 'agent_budget_holds', 'agent_rate_limits']
        LOOP
            EXECUTE format('DROP POLICY IF EXISTS %I ON %I', tbl || '_runtime_all', tbl);
            EXECUTE format('CREATE POLICY %I ON %I TO agentdb_runtime USING (true) WITH CHECK (true)',
                           tbl || '_runtime_all', tbl);
        END LOOP;
        PERFORM set_config('client_min_messages', 'notice', true);
    END IF;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_grant_roles() FROM PUBLIC;

-- G17: the deletion policy of 0012 (kept as agentdb_delete_tenant_0012),
-- after the tenant's books: its holds, budgets and rate limits are deleted
-- first (steps 16-18, reported after 0012's), since the holds refer to the
-- operations and a task budget to its task, which 0012's steps delete.
-- Budgets are configuration and holds are bookkeeping; what was spent stays
-- in the retained events.
ALTER FUNCTION agentdb_delete_tenant(uuid, boolean, text) RENAME TO agentdb_delete_tenant_0012;
CREATE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    holds bigint;
    budgets bigint;
    limits bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;
    IF p_dry_run THEN
        SELECT count(*) INTO holds FROM agent_budget_holds h WHERE h.tenant_id = p_tenant;
        SELECT count(*) INTO budgets FROM agent_budgets b WHERE b.tenant_id = p_tenant;
        SELECT count(*) INTO limits FROM agent_rate_limits r WHERE r.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_budget_holds h WHERE h.tenant_id = p_tenant;
        GET DIAGNOSTICS holds = ROW_COUNT;
        DELETE FROM agent_budgets b WHERE b.tenant_id = p_tenant;
        GET DIAGNOSTICS budgets = ROW_COUNT;
        DELETE FROM agent_rate_limits r WHERE r.tenant_id = p_tenant;
        GET DIAGNOSTICS limits = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT * FROM agentdb_delete_tenant_0012(p_tenant, p_dry_run, p_actor);
    RETURN QUERY SELECT 16, 'agent_budget_holds', 'delete', holds, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 17, 'agent_budgets', 'delete', budgets, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 18, 'agent_rate_limits', 'delete', limits, NULL::timestamptz, NULL::text[];
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant_0012(uuid, boolean, text) FROM PUBLIC;

-- 0013's distribution (kept as agentdb_distribute_0013), with the budget
-- tables in the tenants' colocation group. The global table refuses rows
-- from then on (agent_global_rate_limits_local_only), and the rate-limit
-- trigger, which asks agentdb_distributed(), no longer reads it: see the header.
ALTER PROCEDURE agentdb_distribute(integer) RENAME TO agentdb_distribute_0013;
CREATE PROCEDURE agentdb_distribute(p_shard_count integer DEFAULT 32)
    LANGUAGE plpgsql
AS $$
DECLARE
    tbl text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
       AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                       WHERE c.conrelid = 'agent_global_rate_limits'::regclass
                         AND c.conname = 'agent_global_rate_limits_local_only') THEN
        IF EXISTS (SELECT 1 FROM agent_global_rate_limits) THEN
            RAISE EXCEPTION 'agentdb: global rate limits cannot be kept on Citus'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'delete the agent_global_rate_limits rows and set them per tenant (agent_rate_limits)';
        END IF;
        ALTER TABLE agent_global_rate_limits
            ADD CONSTRAINT agent_global_rate_limits_local_only CHECK (false);
    END IF;
    CALL agentdb_distribute_0013(p_shard_count);
    -- Parents before children, as in 0013.
    FOREACH tbl IN ARRAY ARRAY['agent_budgets', 'agent_budget_holds', 'agent_rate_limits']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = tbl::regclass) THEN
            PERFORM create_distributed_table(tbl, 'tenant_id', colocate_with => 'agent_tenants');
        END IF;
    END LOOP;
    -- The rate-limit trigger updates agent_rate_limits from inside a shard's
    -- insert: always the same tenant, so the colocated shard on the same worker.
    ALTER FUNCTION agentdb_count_call() SET citus.allow_nested_distributed_execution = on;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute(integer) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_0013(integer) FROM PUBLIC;

-- G9, G19: retention (0010's agentdb_purge, 0013's agentdb_purge_tenant, kept
-- as *_0013) and the books. An operation the purge may delete can still have
-- settled or released holds, and a finished task a budget of its own; their
-- foreign keys (RESTRICT, G17) would refuse the purge. So the books of what
-- the purge is about to take go first, by the same rules (settled or failed
-- operations, finished tasks, older than the class's age, nothing else
-- referring to them). Not at most p_batch: the purge takes any p_batch of
-- the eligible rows, so the books of every eligible one go (a bounded step
-- that took other rows' books would leave the purge a row it may not
-- delete, and fail on it run after run). An open hold is never purged: its
-- operation is unsettled and the purge does not take it.
CREATE FUNCTION agentdb_purge_books(p_tenant uuid, p_kind text, p_batch integer,
                                    p_older_than interval)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    IF p_kind = 'operations' THEN
        WITH v AS MATERIALIZED (
            SELECT h.tenant_id, h.operation_id FROM agent_budget_holds h
            JOIN agent_operations op ON op.tenant_id = h.tenant_id AND op.id = h.operation_id
            WHERE (p_tenant IS NULL OR h.tenant_id = p_tenant) AND h.state <> 'held'
              AND op.state IN ('succeeded', 'failed') AND op.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = op.tenant_id AND e.operation_id = op.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = op.tenant_id AND a.operation_id = op.id)
            FOR UPDATE OF h SKIP LOCKED)
        DELETE FROM agent_budget_holds h USING v
        WHERE h.tenant_id = v.tenant_id AND h.operation_id = v.operation_id;
    ELSIF p_kind = 'tasks' THEN
        WITH v AS MATERIALIZED (
            SELECT b.tenant_id, b.id FROM agent_budgets b
            JOIN agent_tasks k ON k.tenant_id = b.tenant_id AND k.id = b.task_id
            WHERE (p_tenant IS NULL OR b.tenant_id = p_tenant) AND b.held = 0
              AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_operations op
                              WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                              WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id)
            FOR UPDATE OF b SKIP LOCKED)
        DELETE FROM agent_budgets b USING v WHERE b.tenant_id = v.tenant_id AND b.id = v.id;
    END IF;
END
$$;

ALTER FUNCTION agentdb_purge(text, integer, interval) RENAME TO agentdb_purge_0013;
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    PERFORM agentdb_purge_books(NULL, p_kind, p_batch, p_older_than);
    RETURN agentdb_purge_0013(p_kind, p_batch, p_older_than);
END
$$;

ALTER FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant_0013;
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    PERFORM agentdb_purge_books(p_tenant, p_kind, p_batch, p_older_than);
    RETURN agentdb_purge_tenant_0013(p_tenant, p_kind, p_batch, p_older_than);
END
$$;
REVOKE EXECUTE ON FUNCTION agentdb_purge_books(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_0013(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant_0013(uuid, text, integer, interval) FROM PUBLIC;

-- The newest migration this schema has; replaced by every later migration.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0014.budgets'::text $$;

CALL agentdb_pin_search_paths();
CALL agentdb_grant_roles();
