-- 0007 schedules: a recurring schedule creates at most one task per tick,
-- however many schedulers run (G24).
-- depends: 0006.control_flow
-- phase: expand
--
-- A schedule (agent_schedules) belongs to a tenant and names a task to
-- create on each tick of its rule: an interval (`every`, ticks at anchor,
-- anchor + every, ...; whole seconds, no months) or a cron expression (five
-- fields, minute hour day-of-month month day-of-week, in UTC; numbers, `*`,
-- ranges, lists, steps). Each task it creates carries (schedule_id,
-- schedule_tick), and agent_tasks_schedule_tick_key makes that pair unique:
-- two schedulers that fire one tick create one task between them, whatever
-- order they run in and whatever they believe. agent_tasks_schedule_guard
-- refuses a tick that is not one of the schedule's (a scheduler with a
-- skewed clock or a bug cannot invent 12:00:00.5 beside 12:00:00), one in
-- the future, or of no schedule of the task's tenant, and any change to a
-- task's schedule or tick (AG017).
--
-- Firing (agentdb_fire_schedule) locks the schedule row (SKIP LOCKED: a
-- second scheduler moves on), creates the due ticks' tasks with their
-- events and moves next_tick_at past them, in one transaction. Catch-up
-- after downtime is the schedule's own policy:
--   'latest' (the default)  one task, for the latest tick that is due; the
--                           ticks missed before it are skipped (its event
--                           says from which tick);
--   'all'                   a task for every missed tick, oldest first, at
--                           most 100 per call (the scheduler calls again).
-- A paused schedule fires nothing; resuming it moves next_tick_at to the
-- first tick after now, so the ticks of the pause are never fired.

-- G24: the values one cron field allows, from p_lo to p_hi, in order; NULL
-- if the field is not valid ('*', 'a', 'a-b', each with an optional '/step',
-- comma-separated).
CREATE FUNCTION agentdb_cron_field(p_field text, p_lo integer, p_hi integer) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    part text;
    m text[];
    a integer;
    b integer;
    step integer;
    allowed integer[] := '{}';
BEGIN
    FOREACH part IN ARRAY string_to_array(p_field, ',') LOOP
        m := regexp_match(part, '^(\*|([0-9]{1,2})(-([0-9]{1,2}))?)(/([0-9]{1,2}))?$');
        IF m IS NULL THEN
            RETURN NULL;
        END IF;
        IF m[1] = '*' THEN
            a := p_lo;
            b := p_hi;
        ELSE
            a := m[2]::integer;
            b := coalesce(m[4]::integer, CASE WHEN m[6] IS NULL THEN a ELSE p_hi END);
        END IF;
        step := coalesce(m[6]::integer, 1);
        IF a < p_lo OR b > p_hi OR a > b OR step < 1 THEN
            RETURN NULL;
        END IF;
        allowed := allowed || ARRAY(SELECT generate_series(a, b, step));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(allowed) v ORDER BY v);
END
$$;

-- G24: whether p_cron is a cron expression agentdb reads (NULL for NULL).
CREATE FUNCTION agentdb_cron_valid(p_cron text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT cardinality(f) = 5
           AND agentdb_cron_field(f[1], 0, 59) IS NOT NULL
           AND agentdb_cron_field(f[2], 0, 23) IS NOT NULL
           AND agentdb_cron_field(f[3], 1, 31) IS NOT NULL
           AND agentdb_cron_field(f[4], 1, 12) IS NOT NULL
           AND agentdb_cron_field(f[5], 0, 7) IS NOT NULL
    FROM regexp_split_to_array(btrim(p_cron), '\s+') f
$$;

-- G24: the cron tick next to p_at - the first after it (p_forward) or the
-- last at or before it - in UTC; NULL for an expression agentdb does not
-- read, 22023 if there is none within 50 years ('0 0 31 2 *' never fires).
-- Days: a day-of-month and a day-of-week that are both restricted (neither
-- starts with '*') match either, as cron has it; 7 is Sunday too.
CREATE FUNCTION agentdb_cron_tick(p_cron text, p_at timestamptz, p_forward boolean)
    RETURNS timestamptz
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    f text[] := regexp_split_to_array(btrim(p_cron), '\s+');
    minutes integer[] := agentdb_cron_field(f[1], 0, 59);
    hours integer[] := agentdb_cron_field(f[2], 0, 23);
    doms integer[] := agentdb_cron_field(f[3], 1, 31);
    months integer[] := agentdb_cron_field(f[4], 1, 12);
    dows integer[] := ARRAY(SELECT DISTINCT v % 7 FROM unnest(agentdb_cron_field(f[5], 0, 7)) v);
    either boolean := left(f[3], 1) <> '*' AND left(f[5], 1) <> '*';
    t timestamp := date_trunc('minute', p_at AT TIME ZONE 'UTC');
    day_ok boolean;
    h integer;
    m integer;
BEGIN
    IF NOT agentdb_cron_valid(p_cron) THEN
        RETURN NULL;  -- agent_schedules_cron_valid says why
    END IF;
    IF p_forward THEN
        t := t + interval '1 minute';
    END IF;
    -- Each turn moves a whole month, day or hour unless it returns.
    FOR turn IN 1..30000 LOOP
        IF NOT extract(month FROM t)::integer = ANY (months) THEN
            t := CASE WHEN p_forward THEN date_trunc('month', t) + interval '1 month'
                      ELSE date_trunc('month', t) - interval '1 minute' END;
            CONTINUE;
        END IF;
        day_ok := CASE WHEN either
                       THEN extract(day FROM t)::integer = ANY (doms)
                            OR extract(dow FROM t)::integer = ANY (dows)
                       ELSE extract(day FROM t)::integer = ANY (doms)
                            AND extract(dow FROM t)::integer = ANY (dows) END;
        IF NOT day_ok THEN
            t := CASE WHEN p_forward THEN date_trunc('day', t) + interval '1 day'
                      ELSE date_trunc('day', t) - interval '1 minute' END;
            CONTINUE;
        END IF;
        IF p_forward THEN
            SELECT min(v) INTO h FROM unnest(hours) v WHERE v >= extract(hour FROM t);
        ELSE
            SELECT max(v) INTO h FROM unnest(hours) v WHERE v <= extract(hour FROM t);
        END IF;
        IF h IS NULL THEN
            t := CASE WHEN p_forward THEN date_trunc('day', t) + interval '1 day'
                      ELSE date_trunc('day', t) - interval '1 minute' END;
            CONTINUE;
        END IF;
        IF h <> extract(hour FROM t) THEN  -- to the first (last) minute of hour h
            t := date_trunc('day', t) + make_interval(hours => h)
                 + CASE WHEN p_forward THEN interval '0' ELSE interval '59 minutes' END;
        END IF;
        IF p_forward THEN
            SELECT min(v) INTO m FROM unnest(minutes) v WHERE v >= extract(minute FROM t);
        ELSE
            SELECT max(v) INTO m FROM unnest(minutes) v WHERE v <= extract(minute FROM t);
        END IF;
        IF m IS NULL THEN
            t := CASE WHEN p_forward THEN date_trunc('hour', t) + interval '1 hour'
                      ELSE date_trunc('hour', t) - interval '1 minute' END;
            CONTINUE;
        END IF;
        RETURN (date_trunc('hour', t) + make_interval(mins => m)) AT TIME ZONE 'UTC';
    END LOOP;
    RAISE EXCEPTION 'agentdb: cron % has no tick within 50 years of %', p_cron, p_at
        USING ERRCODE = 'invalid_parameter_value';
END
$$;

-- G24: the tick of a schedule's rule next to p_at: the first after it
-- (p_forward) or the last at or before it (NULL before the first). Interval
-- ticks are counted in whole seconds from the anchor, so no time zone or
-- daylight saving moves them.
CREATE FUNCTION agentdb_schedule_tick(p_every interval, p_cron text, p_anchor timestamptz,
                                      p_at timestamptz, p_forward boolean)
    RETURNS timestamptz
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    step numeric := extract(epoch FROM p_every);
    n numeric;
    found timestamptz;
BEGIN
    IF p_cron IS NOT NULL THEN
        IF p_forward THEN  -- the first tick after p_at, and not before the anchor
            RETURN agentdb_cron_tick(p_cron, greatest(p_at, p_anchor - interval '1 microsecond'), true);
        END IF;
        found := agentdb_cron_tick(p_cron, p_at, false);
        RETURN CASE WHEN found >= p_anchor THEN found END;
    END IF;
    IF NOT step > 0 THEN
        RETURN NULL;  -- agent_schedules_every_valid says why
    END IF;
    IF p_at < p_anchor THEN
        RETURN CASE WHEN p_forward THEN p_anchor END;
    END IF;
    n := floor((extract(epoch FROM p_at) - extract(epoch FROM p_anchor)) / step)
         + CASE WHEN p_forward THEN 1 ELSE 0 END;
    RETURN p_anchor + make_interval(secs => (n * step)::double precision);
END
$$;

-- G24: whether p_at is a tick of the rule.
CREATE FUNCTION agentdb_schedule_is_tick(p_every interval, p_cron text, p_anchor timestamptz,
                                         p_at timestamptz)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT agentdb_schedule_tick(p_every, p_cron, p_anchor, p_at, false) = p_at
$$;

CREATE TABLE agent_schedules (
    id               uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id        uuid        NOT NULL,
    name             text        NOT NULL,
    task_type        text        NOT NULL,
    workflow_version text        NOT NULL DEFAULT '1',
    params           jsonb       NOT NULL DEFAULT '{}',
    every            interval,
    cron             text,
    anchor           timestamptz NOT NULL,
    catch_up         text        NOT NULL DEFAULT 'latest',
    -- Each task it creates must be over by tick + task_deadline (G21), if set.
    task_deadline    interval,
    paused           boolean     NOT NULL DEFAULT false,
    -- G24: the first tick not fired yet.
    next_tick_at     timestamptz NOT NULL,
    last_tick_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agent_schedules_pkey PRIMARY KEY (tenant_id, id),
    -- G2
    CONSTRAINT agent_schedules_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),
    -- G24: one schedule per name per tenant.
    CONSTRAINT agent_schedules_name_key UNIQUE (tenant_id, name),
    -- G5
    CONSTRAINT agent_schedules_name_valid CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT agent_schedules_task_type_valid CHECK (length(task_type) BETWEEN 1 AND 200),
    CONSTRAINT agent_schedules_workflow_version_valid CHECK (length(workflow_version) BETWEEN 1 AND 100),
    -- G24: one rule, an interval of whole seconds with no months, or cron.
    CONSTRAINT agent_schedules_one_rule CHECK ((every IS NULL) <> (cron IS NULL)),
    CONSTRAINT agent_schedules_every_valid
        CHECK (every >= interval '1 second' AND date_part('month', every) = 0
               AND date_part('year', every) = 0 AND date_trunc('second', every) = every),
    CONSTRAINT agent_schedules_cron_valid CHECK (agentdb_cron_valid(cron)),
    CONSTRAINT agent_schedules_anchor_valid CHECK (date_trunc('second', anchor) = anchor),
    CONSTRAINT agent_schedules_catch_up_valid CHECK (catch_up IN ('latest', 'all')),
    -- G5
    CONSTRAINT agent_schedules_task_deadline_valid CHECK (task_deadline > interval '0'),
    -- G24: the next tick is one of the rule's.
    CONSTRAINT agent_schedules_next_tick_valid
        CHECK (agentdb_schedule_is_tick(every, cron, anchor, next_tick_at)),
    -- G9
    CONSTRAINT agent_schedules_params_valid
        CHECK (jsonb_typeof(params) = 'object' AND octet_length(params::text) <= 65536)
);
-- G24: the scheduler's look-up of what is due.
CREATE INDEX agent_schedules_due_idx ON agent_schedules (next_tick_at) WHERE NOT paused;

-- G24, G2: a task's tick is a due tick of a schedule of its own tenant, and
-- never changes. Checked when the task is made, not kept by a foreign key: a
-- schedule may be deleted (its tasks keep the id and tick they were made
-- for, as an event keeps a name), and so go before its tasks when a tenant is.
CREATE FUNCTION agentdb_guard_schedule_tick() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    s record;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'agentdb: task % is tick % of schedule %; that never changes',
                NEW.id, OLD.schedule_tick, OLD.schedule_id
            USING ERRCODE = 'AG017', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    SELECT k.every, k.cron, k.anchor INTO s FROM agent_schedules k
    WHERE k.tenant_id = NEW.tenant_id AND k.id = NEW.schedule_id;
    IF NOT FOUND OR NEW.schedule_tick > now()
       OR NOT agentdb_schedule_is_tick(s.every, s.cron, s.anchor, NEW.schedule_tick) THEN
        RAISE EXCEPTION 'agentdb: % is not a due tick of a schedule % of tenant %',
                NEW.schedule_tick, NEW.schedule_id, NEW.tenant_id
            USING ERRCODE = 'AG017', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

-- G24: fire schedule p_schedule of tenant p_tenant if it is due: its due
-- ticks' tasks (by its catch-up policy) with their events, next_tick_at
-- past them. Returns the tasks it created. A schedule another scheduler
-- holds is skipped (SKIP LOCKED); had it not been, the tick key would still
-- let only one task in.
CREATE FUNCTION agentdb_fire_schedule(p_tenant uuid, p_schedule uuid)
    RETURNS TABLE (fired_task uuid, fired_tick timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    s record;
    due timestamptz[] := '{}';
    t timestamptz;
    made uuid;
BEGIN
    SELECT * INTO s FROM agent_schedules k
    WHERE k.tenant_id = p_tenant AND k.id = p_schedule
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR s.paused OR s.next_tick_at > now() THEN
        RETURN;
    END IF;
    IF s.catch_up = 'latest' THEN
        due := ARRAY[agentdb_schedule_tick(s.every, s.cron, s.anchor, now(), false)];
    ELSE
        t := s.next_tick_at;
        WHILE t IS NOT NULL AND t <= now() AND cardinality(due) < 100 LOOP
            due := due || t;
            t := agentdb_schedule_tick(s.every, s.cron, s.anchor, t, true);
        END LOOP;
    END IF;
    FOREACH t IN ARRAY due LOOP
        made := NULL;
        INSERT INTO agent_tasks AS k (tenant_id, task_type, workflow_version, params, wake_at,
                                      deadline_at, schedule_id, schedule_tick)
        VALUES (p_tenant, s.task_type, s.workflow_version, s.params, now(),
                t + s.task_deadline, p_schedule, t)
        ON CONFLICT (tenant_id, schedule_id, schedule_tick) DO NOTHING
        RETURNING k.id INTO made;
        IF made IS NOT NULL THEN
            INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                      to_state, task_state_version, payload)
            VALUES (p_tenant, made, 'task.created', 'agentdb.scheduler', s.workflow_version,
                    'pending', 0,
                    jsonb_strip_nulls(jsonb_build_object(
                        'schedule', s.name, 'tick', t,
                        'skipped_from', CASE WHEN t > s.next_tick_at AND s.catch_up = 'latest'
                                             THEN s.next_tick_at END)));
            fired_task := made;
            fired_tick := t;
            RETURN NEXT;
        END IF;
    END LOOP;
    -- A plain variable, not due[...]: Citus 13.2 crashes on an array subscript in a
    -- distributed UPDATE's parameters.
    t := due[cardinality(due)];
    UPDATE agent_schedules k
    SET next_tick_at = agentdb_schedule_tick(s.every, s.cron, s.anchor, t, true),
        last_tick_at = t, updated_at = now()
    WHERE k.tenant_id = p_tenant AND k.id = p_schedule;
END
$$;

-- G24: pause a schedule (p_paused) or resume it. A resumed schedule's next
-- tick is the first after now if its own has passed: the ticks of the pause
-- are never fired. A function, not one UPDATE: Citus refuses now() beside
-- column references in a distributed UPDATE, and takes a variable. Its
-- columns are spelled out, not SETOF agent_schedules: Citus does not
-- propagate a function of a local table's row type, and never did later on
-- an install distributed already (the workers lacked it).
CREATE FUNCTION agentdb_pause_schedule(p_tenant uuid, p_name text, p_paused boolean)
    RETURNS TABLE (id uuid, tenant_id uuid, name text, task_type text, workflow_version text,
                   params jsonb, every interval, cron text, anchor timestamptz,
                   catch_up text, task_deadline interval, paused boolean,
                   next_tick_at timestamptz, last_tick_at timestamptz,
                   created_at timestamptz, updated_at timestamptz)
    LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    at timestamptz := now();
BEGIN
    RETURN QUERY
    UPDATE agent_schedules k
    SET paused = p_paused, updated_at = at,
        next_tick_at = CASE WHEN p_paused OR k.next_tick_at > at THEN k.next_tick_at
                            ELSE agentdb_schedule_tick(k.every, k.cron, k.anchor, at, true) END
    WHERE k.tenant_id = p_tenant AND k.name = p_name
    RETURNING k.id, k.tenant_id, k.name, k.task_type, k.workflow_version, k.params, k.every,
              k.cron, k.anchor, k.catch_up, k.task_deadline, k.paused, k.next_tick_at,
              k.last_tick_at, k.created_at, k.updated_at;
END
$$;

-- G24: only a scheduled task's insert calls it.
CREATE TRIGGER agent_tasks_schedule_guard
    BEFORE INSERT ON agent_tasks
    FOR EACH ROW WHEN (NEW.schedule_id IS NOT NULL)
    EXECUTE FUNCTION agentdb_guard_schedule_tick();
-- G24: only a write that changes a task's schedule or tick calls it.
CREATE TRIGGER agent_tasks_schedule_fixed
    BEFORE UPDATE OF schedule_id, schedule_tick ON agent_tasks
    FOR EACH ROW WHEN (NEW.schedule_id IS DISTINCT FROM OLD.schedule_id
                       OR NEW.schedule_tick IS DISTINCT FROM OLD.schedule_tick)
    EXECUTE FUNCTION agentdb_guard_schedule_tick();

REVOKE EXECUTE ON FUNCTION agentdb_fire_schedule(uuid, uuid) FROM PUBLIC;

CALL agentdb_pin_search_paths();
