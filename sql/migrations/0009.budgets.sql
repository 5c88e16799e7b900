-- 0009 budgets: spend budgets and provider rate limits, refused by the
-- database at reserve (G19).
-- depends: 0008.steps
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
-- re-armed retry of a failed one, whoever writes it, and refuses the call
-- over the limit (AG011), with the CHECK agent_rate_limits_within_limit
-- behind it.
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

-- G19: one more call of a rate limit at p_at (a window of p_per from p_start
-- with p_used calls): the calls its window then holds, and the window's
-- start (a window that has passed starts again at the aligned bin of p_at).
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

-- G19: count one call of NEW.action against its rate limits: the tenant's
-- and (not on Citus: see the header) the global one. Each limit is read under
-- its row lock, stepped (agentdb_rate_step) and written back as constants:
-- Citus refuses now() inside a CASE of a distributed UPDATE. A limit with no
-- room left is not written, and the call is refused (AG011, naming this
-- trigger) and with it the operation; the CHECK agent_rate_limits_within_limit
-- stands behind it for any other writer of the counters.
--
-- The instant a call is counted at is the one its operation's row and event
-- carry: least(now(), the row's own stamp) - created_at on insert,
-- updated_at on a re-arm that sets it. On plain Postgres both are now(), the
-- transaction's start. On Citus they differ: the coordinator evaluates now()
-- in the statements it routes (created_at, updated_at and the event's
-- created_at are its transaction start), while the trigger runs on the
-- worker, whose transaction begins when the coordinator first reaches it -
-- later, by as long as the caller's transaction waited before reserving. A
-- writer can move the instant only earlier than now(), which never starts a
-- window: it is counted in the current one or, before it, refused as late.
--
-- Late: the count is read under the limit's row lock, and a transaction that
-- began just before a window ended can get that lock only after a later one
-- has started the next window. Counted in the new window, its event would
-- lie in the old one: measured from the events, the old window would hold up
-- to twice its limit (three workers, 5 per second: 9 in one second). The old
-- window's count is gone by then, so whether it had room is unknown: the
-- call is refused (AG011, as any call over the limit) and its retry, a new
-- transaction, is counted where its own event will lie. The window has room
-- by then, so agentdb.budgets reports "retry at once". (A window that starts
-- after clock_timestamp() can only come from a clock that stepped back: such
-- a call is counted in it rather than refused until the clock catches up.)
CREATE FUNCTION agentdb_count_call() RETURNS trigger
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

-- G19: a new operation is a call; so is the re-armed retry of a failed one.
CREATE TRIGGER agent_operations_rate_limit
    AFTER INSERT ON agent_operations
    FOR EACH ROW EXECUTE FUNCTION agentdb_count_call();
-- G19
CREATE TRIGGER agent_operations_rate_limit_retry
    AFTER UPDATE OF state ON agent_operations
    FOR EACH ROW WHEN (OLD.state = 'failed' AND NEW.state = 'reserved')
    EXECUTE FUNCTION agentdb_count_call();

CALL agentdb_pin_search_paths();
