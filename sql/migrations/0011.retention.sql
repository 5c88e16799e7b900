-- 0011 retention: what leaves the database, and when - the purge of each
-- retention class in small batches (G9), the tenant deletion policy (G17),
-- and the audit trail by month (opt-in, G8, G9).
-- depends: 0010.access
-- phase: expand
--
-- agentdb_purge(kind, batch, older_than) removes at most `batch` rows of one
-- retention class per call and returns how many it removed. Each call is its
-- own short statement: `agentdb purge` calls it until it returns less than a
-- batch, so no lock is held for long, an interrupted purge simply resumes,
-- and live traffic keeps its SKIP LOCKED claims (purge skips locked rows too).
--
--   event_payloads     erase payloads past payload_expires_at (the one UPDATE
--                      the append-only guard allows)
--   events             delete audit events past retain_until (the guard allows
--                      exactly these)
--   outbox_delivered   delete delivered outbox rows older than `older_than`
--   inbox              delete inbox rows older than `older_than` (keep it longer
--                      than any redelivery can take)
--   operations         delete settled operations older than `older_than` that
--                      no event or artifact refers to (an operation is the
--                      idempotency ledger: it lives as long as its audit trail),
--                      with their settled budget holds first
--   signals            delete the signals of finished tasks the tasks class may
--                      take (every signal has an event, so only once the
--                      task's retained events are gone)
--   tasks              delete finished tasks older than `older_than` with no
--                      remaining events, operations, outbox rows, artifacts,
--                      signals or children, with their steps and their own
--                      budgets first
--
-- agentdb_purge_tenant(tenant, kind, batch, older_than) is the same for one
-- tenant: on Citus every statement names the tenant, so each routes to the
-- tenant's worker (agentdb_purge's cross-tenant FOR UPDATE is refused there);
-- the victims are picked in a MATERIALIZED CTE so a batch is never exceeded.
-- Owner only by default; GRANT EXECUTE to a maintenance role to delegate.
--
-- agentdb_delete_tenant(tenant, dry_run, actor) applies the tenant deletion
-- policy, in order, and returns one row per step with the rows it touched
-- (or, with dry_run, would touch - each step counts with the same predicate
-- it acts on):
--
--   steps, schedules   delete (a handler's working memory; configuration)
--   signals            delete (what was signalled stays in the events)
--   budget holds,      delete (bookkeeping and configuration; what was spent
--   budgets, limits    stays in the retained events)
--   tenants            mark 'deleting'; the row goes when nothing else remains
--   principals         delete the pins: the tenant's agent logins see nothing
--   credential_refs    delete; refs = the secret references to revoke in the
--                      secret manager (the database never held the secrets)
--   artifacts          delete; refs = the blob URIs for the caller to purge
--   inbox, outbox      delete (undelivered messages are dropped, not sent)
--   tasks              cancel unfinished ones, anonymise params / step / error
--   operations         anonymise result and error (provider references stay:
--                      they are what a refund or dispute needs)
--   events             erase every payload now; the audit skeleton is retained
--                      until its retain_until, then deleted - the append-only
--                      guard (G8) refuses earlier deletion, by design
--   operations, tasks  delete once no retained event refers to them
--   concurrency limits delete (configuration, not history)
--   tenant             delete, once nothing of it is retained
--
-- The first group goes first, since it refers to the tasks and operations
-- the later steps delete; its rows are reported last (steps 16-21), after
-- the policy's own steps 1-15. Anonymising is a state write like any other:
-- it moves state_version and writes its event (G7, G8). Only rows that are
-- kept (some event about them is still under retention) are anonymised; the
-- rest are deleted outright. The anonymisation events inherit the retention
-- of the row's existing events, so deleting never extends how long a tenant
-- is kept. Running it again does only what became possible since (a no-op
-- right away; the final deletion once retention has passed).
--
-- Events by month change no table until asked: what the layout needs and two
-- procedures: agentdb_partition_events() converts agent_events in place
-- (`agentdb migrate --events-by-month` calls it), agentdb_unpartition_events()
-- converts it back. Opt-in because of what it costs: one event per recorded
-- version (G8) cannot be a unique index on a partitioned table (its unique
-- keys must hold created_at, and then they are not unique per version), so
-- two deferred constraint triggers keep the rule - and they cost: the
-- batched cycle's server CPU per task was 1.24-1.34x that of one table on
-- the development machine (partitioning with the triggers off: 1.0-1.1x). A
-- key holding the partition key would cost nothing extra, but needs the
-- task's created_at in every versioned event insert: a change to the insert
-- contract, not made here.
--
-- Partitioned, nothing a writer sends changes: the partition key is the
-- event's own created_at (DEFAULT now()), so the article's INSERT and every
-- runtime statement route on their own. What changes:
--
-- * The primary key is (tenant_id, id, created_at): a partitioned table's
--   unique keys must hold its partition key. id still comes from one sequence.
-- * The triggers keep the unique keys' names (agent_events_task_version_key,
--   agent_events_operation_version_key; errors map on them; the lookup
--   indexes, no longer unique, keep them too): at commit, an event that
--   records task (operation) version v must be the only one recording it, the
--   task must have reached v, and the event may not be more than a day older
--   than the task (a transaction that began before the task was created may
--   still record its versions; one a day older may not).
--   Why "reached v" makes the rule race-free at any isolation level: a second
--   event for v can only pass it in a snapshot that sees the transaction that
--   moved the task to v - and that transaction's own event for v, committed
--   with it. (A row lock on the task covers the one case left: two rivals
--   for a version whose first event retention already deleted.) The
--   last rule bounds every lookup of a task's events to the months since a
--   day before the task was created (run-time partition pruning) instead of
--   probing every month.
-- * The old table becomes the partition agent_events_legacy, holding every
--   instant before next month (UTC); events go on landing there until then.
--   Its rows dated later (an explicit created_at in the future) move to the
--   DEFAULT partition, which takes whatever no month partition covers (a
--   month nobody created yet), so an insert never fails for want of one.
-- * Months are created ahead (this month and the next two at the
--   conversion; then by agentdb_event_partitions(), which `agentdb purge`
--   runs), and a month is dropped whole once it is over and none of its
--   rows is retained any more. The row path (agentdb_purge 'events') stays
--   for the rest.
-- * TRUNCATE triggers are not inherited, so each partition carries its own
--   agent_events_no_truncate. Partitions have no grants: only the owner
--   reaches one directly, and RLS stays on agent_events.
--
-- Converting an install that holds events: one transaction under ACCESS
-- EXCLUSIVE on the old table (event reads and writes wait): three index
-- builds and the attach's check that every row lies before the cut-over.
-- On the 2-core development machine it took 2.3-2.6 s for 1.2 million
-- events (back to one table, which copies every row: 18 s).

-- G9, G19: the books of what a purge is about to take. An operation the
-- purge may delete can still have settled or released holds, and a finished
-- task a budget of its own; their foreign keys (RESTRICT, G17) would refuse
-- the purge. So they go first, by the same rules (settled or failed
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

-- G9: the signals of a finished task the tasks purge may take (by its rules),
-- at most p_batch of them per call. Every signal has an event, so a task's
-- signals are only purged once its retained events are. Two statements, as
-- agentdb_purge_tasks: on Citus the tenant's must name it.
CREATE FUNCTION agentdb_purge_task_signals(p_tenant uuid, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    -- From the finished tasks (agent_tasks_finished_idx) to their signals
    -- (agent_signals_seq_key): the work before the LIMIT is bounded by them.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_signals s
        USING (SELECT g.tenant_id, g.id FROM agent_tasks k
               JOIN agent_signals g ON g.tenant_id = k.tenant_id AND g.task_id = k.id
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
               LIMIT p_batch) v
        WHERE s.tenant_id = v.tenant_id AND s.id = v.id;
    ELSE
        WITH v AS MATERIALIZED (
            SELECT g.id FROM agent_tasks k
            JOIN agent_signals g ON g.tenant_id = p_tenant AND g.task_id = k.id
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
            LIMIT p_batch)
        DELETE FROM agent_signals s USING v WHERE s.tenant_id = p_tenant AND s.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9, G17: the tasks class. A finished task is taken only once nothing
-- refers to it any more - no event, operation, outbox row, artifact, signal
-- (the 'signals' class goes first), step or child (a parent stays while its
-- children do, so a batch never picks a parent whose child it leaves
-- behind). What only belongs to it goes first, by the same rules: its own
-- budgets (agentdb_purge_books) and its steps. A step is never written for a
-- finished task (agent_steps_guard), so none appears after.
CREATE FUNCTION agentdb_purge_tasks(p_tenant uuid, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    PERFORM agentdb_purge_books(p_tenant, 'tasks', p_batch, p_older_than);
    -- Two statements each, not one with "p_tenant IS NULL OR": on Citus the
    -- tenant's must name it to route to its worker.
    IF p_tenant IS NULL THEN
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE k.tenant_id = s.tenant_id AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id);
        DELETE FROM agent_tasks t
        USING (SELECT k.tenant_id, k.id FROM agent_tasks k
               WHERE k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
                 AND k.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = k.tenant_id AND e.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_operations op
                                 WHERE op.tenant_id = k.tenant_id AND op.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                                 WHERE ob.tenant_id = k.tenant_id AND ob.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = k.tenant_id AND a.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_signals s
                                 WHERE s.tenant_id = k.tenant_id AND s.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_steps st
                                 WHERE st.tenant_id = k.tenant_id AND st.task_id = k.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                                 WHERE c.tenant_id = k.tenant_id AND c.parent_id = k.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE t.tenant_id = v.tenant_id AND t.id = v.id;
    ELSE
        DELETE FROM agent_steps s
        USING agent_tasks k
        WHERE s.tenant_id = p_tenant AND k.tenant_id = p_tenant AND k.id = s.task_id
          AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND k.updated_at <= now() - p_older_than
          AND NOT EXISTS (SELECT 1 FROM agent_events e
                          WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
          AND NOT EXISTS (SELECT 1 FROM agent_operations op
                          WHERE op.tenant_id = p_tenant AND op.task_id = k.id);
        WITH v AS MATERIALIZED (
            SELECT k.id FROM agent_tasks k
            WHERE k.tenant_id = p_tenant AND k.state IN ('succeeded', 'failed', 'cancelled', 'dead')
              AND k.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_operations op
                              WHERE op.tenant_id = p_tenant AND op.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_outbox ob
                              WHERE ob.tenant_id = p_tenant AND ob.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_signals s
                              WHERE s.tenant_id = p_tenant AND s.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_steps st
                              WHERE st.tenant_id = p_tenant AND st.task_id = k.id)
              AND NOT EXISTS (SELECT 1 FROM agent_tasks c
                              WHERE c.tenant_id = p_tenant AND c.parent_id = k.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_tasks t USING v WHERE t.tenant_id = p_tenant AND t.id = v.id;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9: retention, every tenant (see the header). Events are taken by their
-- whole primary key (tenant_id, id, created_at): by month an id is unique
-- only with its created_at, and by (tenant_id, id) alone a row inserted with
-- a copied id (anyone who may INSERT events may name one) would be taken
-- along with the expired row it copies - and a retained one refused by the
-- append-only guard, failing the whole batch.
CREATE FUNCTION agentdb_purge(p_kind text, p_batch integer, p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(NULL, p_batch, p_older_than);
    ELSIF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(NULL, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    CASE p_kind
    WHEN 'event_payloads' THEN
        UPDATE agent_events e SET payload = NULL
        FROM (SELECT tenant_id, id, created_at FROM agent_events
              WHERE payload IS NOT NULL AND payload_expires_at <= now()
              LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        DELETE FROM agent_events e
        USING (SELECT tenant_id, id, created_at FROM agent_events WHERE retain_until <= now()
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'outbox_delivered' THEN
        DELETE FROM agent_outbox o
        USING (SELECT tenant_id, id FROM agent_outbox
               WHERE state = 'delivered' AND delivered_at <= now() - p_older_than
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE o.tenant_id = v.tenant_id AND o.id = v.id;
    WHEN 'inbox' THEN
        DELETE FROM agent_inbox i
        USING (SELECT tenant_id, consumer, message_id FROM agent_inbox
               WHERE processed_at <= now() - p_older_than
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE i.tenant_id = v.tenant_id AND i.consumer = v.consumer
          AND i.message_id = v.message_id;
    WHEN 'operations' THEN
        PERFORM agentdb_purge_books(NULL, p_kind, p_batch, p_older_than);
        DELETE FROM agent_operations o
        USING (SELECT op.tenant_id, op.id FROM agent_operations op
               WHERE op.state IN ('succeeded', 'failed')
                 AND op.updated_at <= now() - p_older_than
                 AND NOT EXISTS (SELECT 1 FROM agent_events e
                                 WHERE e.tenant_id = op.tenant_id AND e.operation_id = op.id)
                 AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                                 WHERE a.tenant_id = op.tenant_id AND a.operation_id = op.id)
               LIMIT p_batch FOR UPDATE SKIP LOCKED) v
        WHERE o.tenant_id = v.tenant_id AND o.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- G9: retention, one tenant (see the header).
CREATE FUNCTION agentdb_purge_tenant(p_tenant uuid, p_kind text, p_batch integer,
                                     p_older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
BEGIN
    IF p_kind = 'tasks' THEN
        RETURN agentdb_purge_tasks(p_tenant, p_batch, p_older_than);
    ELSIF p_kind = 'signals' THEN
        RETURN agentdb_purge_task_signals(p_tenant, p_batch, p_older_than);
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
        RAISE EXCEPTION 'agentdb: purge batch must be between 1 and 100000, not %', p_batch
            USING ERRCODE = '22023';
    END IF;
    CASE p_kind
    WHEN 'event_payloads' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND payload IS NOT NULL AND payload_expires_at <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        UPDATE agent_events e SET payload = NULL FROM v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'events' THEN
        WITH v AS MATERIALIZED (
            SELECT id, created_at FROM agent_events
            WHERE tenant_id = p_tenant AND retain_until <= now()
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_events e USING v
        WHERE e.tenant_id = p_tenant AND e.id = v.id AND e.created_at = v.created_at;
    WHEN 'outbox_delivered' THEN
        WITH v AS MATERIALIZED (
            SELECT id FROM agent_outbox
            WHERE tenant_id = p_tenant AND state = 'delivered'
              AND delivered_at <= now() - p_older_than
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_outbox o USING v WHERE o.tenant_id = p_tenant AND o.id = v.id;
    WHEN 'inbox' THEN
        WITH v AS MATERIALIZED (
            SELECT consumer, message_id FROM agent_inbox
            WHERE tenant_id = p_tenant AND processed_at <= now() - p_older_than
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_inbox i USING v
        WHERE i.tenant_id = p_tenant AND i.consumer = v.consumer AND i.message_id = v.message_id;
    WHEN 'operations' THEN
        PERFORM agentdb_purge_books(p_tenant, p_kind, p_batch, p_older_than);
        WITH v AS MATERIALIZED (
            SELECT op.id FROM agent_operations op
            WHERE op.tenant_id = p_tenant AND op.state IN ('succeeded', 'failed')
              AND op.updated_at <= now() - p_older_than
              AND NOT EXISTS (SELECT 1 FROM agent_events e
                              WHERE e.tenant_id = p_tenant AND e.operation_id = op.id)
              AND NOT EXISTS (SELECT 1 FROM agent_artifacts a
                              WHERE a.tenant_id = p_tenant AND a.operation_id = op.id)
            LIMIT p_batch FOR UPDATE SKIP LOCKED)
        DELETE FROM agent_operations o USING v WHERE o.tenant_id = p_tenant AND o.id = v.id;
    ELSE
        RAISE EXCEPTION 'agentdb: unknown retention class %', p_kind USING ERRCODE = '22023';
    END CASE;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_purge_books(uuid, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_task_signals(uuid, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tasks(uuid, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge(text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION agentdb_purge_tenant(uuid, text, integer, interval) FROM PUBLIC;

-- G17: the tenant deletion policy (see the header). Steps 7 and 8 take each
-- row's retention from one grouped read of the tenant's events instead of a
-- LATERAL aggregate per row: the same result, and a form Citus can push
-- down to the tenant's shard.
CREATE FUNCTION agentdb_delete_tenant(p_tenant uuid, p_dry_run boolean, p_actor text)
    RETURNS TABLE (step integer, object text, action text, affected bigint,
                   retained_until timestamptz, refs text[])
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    n bigint;
    anonymised bigint := 0;  -- events steps 7 and 8 write (or would write)
    r text[];
    n_steps bigint;
    n_schedules bigint;
    n_signals bigint;
    n_holds bigint;
    n_budgets bigint;
    n_limits bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agent_tenants t WHERE t.id = p_tenant) THEN
        RETURN;
    END IF;

    -- 16-21, done first: they refer to the tasks and operations the steps
    -- below delete (a task budget to its task, a hold to its operation, a
    -- signal or step to its task); schedules go first so none fires while
    -- the tenant goes.
    IF p_dry_run THEN
        SELECT count(*) INTO n_steps FROM agent_steps s WHERE s.tenant_id = p_tenant;
        SELECT count(*) INTO n_schedules FROM agent_schedules s WHERE s.tenant_id = p_tenant;
        SELECT count(*) INTO n_signals FROM agent_signals s WHERE s.tenant_id = p_tenant;
        SELECT count(*) INTO n_holds FROM agent_budget_holds h WHERE h.tenant_id = p_tenant;
        SELECT count(*) INTO n_budgets FROM agent_budgets b WHERE b.tenant_id = p_tenant;
        SELECT count(*) INTO n_limits FROM agent_rate_limits r WHERE r.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_steps s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n_steps = ROW_COUNT;
        DELETE FROM agent_schedules s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n_schedules = ROW_COUNT;
        DELETE FROM agent_signals s WHERE s.tenant_id = p_tenant;
        GET DIAGNOSTICS n_signals = ROW_COUNT;
        DELETE FROM agent_budget_holds h WHERE h.tenant_id = p_tenant;
        GET DIAGNOSTICS n_holds = ROW_COUNT;
        DELETE FROM agent_budgets b WHERE b.tenant_id = p_tenant;
        GET DIAGNOSTICS n_budgets = ROW_COUNT;
        DELETE FROM agent_rate_limits r WHERE r.tenant_id = p_tenant;
        GET DIAGNOSTICS n_limits = ROW_COUNT;
    END IF;

    -- 1. tenants: mark deleting
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t WHERE t.id = p_tenant AND t.state <> 'deleting';
    ELSE
        UPDATE agent_tenants t SET state = 'deleting', updated_at = now()
        WHERE t.id = p_tenant AND t.state <> 'deleting';
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 1, 'agent_tenants', 'mark deleting', n, NULL::timestamptz, NULL::text[];

    -- 2. principals
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_principals p WHERE p.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_principals p WHERE p.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 2, 'agent_principals', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 3. credential references
    SELECT coalesce(array_agg(c.secret_ref ORDER BY c.secret_ref), '{}') INTO r
    FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 3, 'agent_credential_refs', 'delete (revoke refs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 4. artifacts
    SELECT coalesce(array_agg(a.uri ORDER BY a.uri), '{}') INTO r
    FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    IF NOT p_dry_run THEN
        DELETE FROM agent_artifacts a WHERE a.tenant_id = p_tenant;
    END IF;
    RETURN QUERY SELECT 4, 'agent_artifacts', 'delete (purge blobs)', cardinality(r)::bigint,
                        NULL::timestamptz, r;

    -- 5. inbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_inbox i WHERE i.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_inbox i WHERE i.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 5, 'agent_inbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 6. outbox
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_outbox o WHERE o.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_outbox o WHERE o.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 6, 'agent_outbox', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 7. tasks: cancel and anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant
          AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
               OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                      AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_tasks t
            SET state = CASE WHEN t.state IN ('pending', 'waiting', 'running') THEN 'cancelled'
                             ELSE t.state END,
                state_version = t.state_version + 1,
                params = '{}', last_error = NULL, current_step = NULL,
                lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                updated_at = now()
            WHERE t.tenant_id = p_tenant
              AND (t.state IN ('pending', 'waiting', 'running') OR t.params <> '{}'
                   OR t.last_error IS NOT NULL OR t.current_step IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
                          AND e.task_id = t.id AND e.retain_until > now())
            RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                                      to_state, task_state_version, payload, payload_expires_at,
                                      retain_until)
            SELECT u.tenant_id, u.id, 'task.anonymised', p_actor, u.workflow_version, u.state,
                   u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            LEFT JOIN (
                SELECT e.task_id, max(e.retain_until) AS until FROM agent_events e
                WHERE e.tenant_id = p_tenant GROUP BY e.task_id) kept ON kept.task_id = u.id
            CROSS JOIN LATERAL (SELECT coalesce(kept.until, now()) AS until) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 7, 'agent_tasks', 'cancel and anonymise', n, NULL::timestamptz, NULL::text[];

    -- 8. operations: anonymise, each with its event
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
          AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                      AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        WITH upd AS (
            UPDATE agent_operations o
            SET result = NULL, error = NULL, state_version = o.state_version + 1, updated_at = now()
            WHERE o.tenant_id = p_tenant AND (o.result IS NOT NULL OR o.error IS NOT NULL)
              AND EXISTS (SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
                          AND e.operation_id = o.id AND e.retain_until > now())
            RETURNING o.tenant_id, o.id, o.task_id, o.state, o.state_version
        ), ins AS (
            INSERT INTO agent_events (tenant_id, task_id, operation_id, event_type, actor_id,
                                      policy_version, to_state, operation_state_version, payload,
                                      payload_expires_at, retain_until)
            SELECT u.tenant_id, u.task_id, u.id, 'operation.anonymised', p_actor, 'tenant-deletion',
                   u.state, u.state_version, NULL, least(now(), keep.until), keep.until
            FROM upd u
            LEFT JOIN (
                SELECT e.operation_id, max(e.retain_until) AS until FROM agent_events e
                WHERE e.tenant_id = p_tenant AND e.operation_id IS NOT NULL
                GROUP BY e.operation_id) kept ON kept.operation_id = u.id
            CROSS JOIN LATERAL (SELECT coalesce(kept.until, now()) AS until) keep
            RETURNING 1
        )
        SELECT count(*) INTO n FROM ins;
    END IF;
    anonymised := anonymised + n;
    RETURN QUERY SELECT 8, 'agent_operations', 'anonymise', n, NULL::timestamptz, NULL::text[];

    -- 9. events: erase payloads now (the one UPDATE the append-only guard allows)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
    ELSE
        UPDATE agent_events e SET payload = NULL
        WHERE e.tenant_id = p_tenant AND e.payload IS NOT NULL;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 9, 'agent_events', 'erase payloads', n, NULL::timestamptz, NULL::text[];

    -- 10. events past their retention
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
    ELSE
        DELETE FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until <= now();
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 10, 'agent_events', 'delete (retention passed)', n, NULL::timestamptz, NULL::text[];

    -- 11. events still under retention: kept for audit (a dry run adds the
    -- anonymisation events a real run would have written by now)
    SELECT count(*), max(e.retain_until) INTO n, retained_until
    FROM agent_events e WHERE e.tenant_id = p_tenant AND e.retain_until > now();
    IF p_dry_run THEN
        n := n + anonymised;
    END IF;
    RETURN QUERY SELECT 11, 'agent_events', 'retain for audit', n, retained_until, NULL::text[];

    -- 12. operations no retained event refers to
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id
              AND e.operation_id = o.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_operations o
        WHERE o.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = o.tenant_id AND e.operation_id = o.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 12, 'agent_operations', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 13. tasks no retained event refers to (their operations, outbox rows and
    -- artifacts are gone by now)
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id
              AND e.task_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tasks t
        WHERE t.tenant_id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 13, 'agent_tasks', 'delete (no retained events)', n, NULL::timestamptz, NULL::text[];

    -- 14. concurrency limits (G18): configuration, not history
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_concurrency_limits l WHERE l.tenant_id = p_tenant;
    ELSE
        DELETE FROM agent_concurrency_limits l WHERE l.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 14, 'agent_concurrency_limits', 'delete', n, NULL::timestamptz, NULL::text[];

    -- 15. the tenant itself, once nothing of it is retained
    IF p_dry_run THEN
        SELECT count(*) INTO n FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (
            SELECT 1 FROM agent_events e WHERE e.tenant_id = t.id AND e.retain_until > now());
    ELSE
        DELETE FROM agent_tenants t
        WHERE t.id = p_tenant AND NOT EXISTS (SELECT 1 FROM agent_tasks k WHERE k.tenant_id = t.id);
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT 15, 'agent_tenants', 'delete', n, NULL::timestamptz, NULL::text[];

    RETURN QUERY SELECT 16, 'agent_budget_holds', 'delete', n_holds, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 17, 'agent_budgets', 'delete', n_budgets, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 18, 'agent_rate_limits', 'delete', n_limits, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 19, 'agent_signals', 'delete', n_signals, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 20, 'agent_schedules', 'delete', n_schedules, NULL::timestamptz, NULL::text[];
    RETURN QUERY SELECT 21, 'agent_steps', 'delete', n_steps, NULL::timestamptz, NULL::text[];
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_delete_tenant(uuid, boolean, text) FROM PUBLIC;

-- Two steps both conversions take. On a distributed schema the new table
-- is distributed like the one it replaces, before anything refers to it
-- (dynamic: without Citus there is no pg_dist_partition to name).
CREATE PROCEDURE agentdb_distribute_like(p_old regclass, p_new regclass)
    LANGUAGE plpgsql
AS $$
DECLARE
    distributed boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = $1)'
            INTO distributed USING p_old;
    END IF;
    IF distributed THEN
        EXECUTE 'SELECT create_distributed_table($1, ''tenant_id'', colocate_with => ''agent_tenants'')'
            USING p_new;
    END IF;
END
$$;
-- G15: a table's grants and policies (agentdb's own and any an operator
-- added) go to its replacement; with p_revoke the old one keeps none - a
-- query naming a partition skips the root's policies, so only the owner may
-- name one.
CREATE PROCEDURE agentdb_move_access(p_from regclass, p_to regclass, p_revoke boolean)
    LANGUAGE plpgsql
AS $$
DECLARE
    g record;
    p record;
BEGIN
    FOR g IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who,
               a.privilege_type, a.is_grantable,
               CASE WHEN c.relkind = 'S' THEN 'SEQUENCE ' ELSE '' END AS kind
        FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = p_from AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %s%s TO %s%s', g.privilege_type, g.kind, p_to, g.who,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        IF p_revoke THEN
            EXECUTE format('REVOKE ALL ON %s%s FROM %s', g.kind, p_from, g.who);
        END IF;
    END LOOP;
    FOR p IN
        SELECT y.polname, y.polpermissive, y.polcmd,
               pg_get_expr(y.polqual, y.polrelid) AS qual,
               pg_get_expr(y.polwithcheck, y.polrelid) AS with_check,
               (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE r::regrole::text END, ', ')
                FROM unnest(y.polroles) AS r) AS who
        FROM pg_policy y WHERE y.polrelid = p_from
    LOOP
        EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s',
                       p.polname, p_to, CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                       CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                     WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                       p.who,
                       CASE WHEN p.qual IS NULL THEN '' ELSE ' USING (' || p.qual || ')' END,
                       CASE WHEN p.with_check IS NULL THEN ''
                            ELSE ' WITH CHECK (' || p.with_check || ')' END);
        IF p_revoke THEN
            EXECUTE format('DROP POLICY %I ON %s', p.polname, p_from);
        END IF;
    END LOOP;
END
$$;
REVOKE EXECUTE ON PROCEDURE agentdb_distribute_like(regclass, regclass) FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_move_access(regclass, regclass, boolean) FROM PUBLIC;

-- G8: at most one event per recorded version, for a version the task or
-- operation has reached, at most a day older than its task or operation.
-- Checked at commit, so the event may come before the state change it records.
CREATE FUNCTION agentdb_event_records_once() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    recorded bigint;
    reached bigint;
    born timestamptz;
    n bigint;
BEGIN
    IF TG_ARGV[0] = 'task' THEN
        recorded := NEW.task_state_version;
        -- The row lock makes writers of one task's events take turns: at READ
        -- COMMITTED the count below then sees a rival committed while this one
        -- waited (a rival for a version whose first event retention deleted).
        -- The transaction that moved the task holds it already; a row lock
        -- takes no room in the lock table, however many events commit at once.
        SELECT t.state_version, t.created_at INTO reached, born FROM agent_tasks t
        WHERE t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id
        FOR NO KEY UPDATE;
        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN
            SELECT count(*) INTO n FROM (
                SELECT FROM agent_events e
                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id
                  AND e.task_state_version = recorded
                  AND e.created_at >= born - interval '1 day'
                LIMIT 2) twice;
        END IF;
    ELSE
        recorded := NEW.operation_state_version;
        SELECT o.state_version, o.created_at INTO reached, born FROM agent_operations o
        WHERE o.tenant_id = NEW.tenant_id AND o.id = NEW.operation_id
        FOR NO KEY UPDATE;
        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN
            SELECT count(*) INTO n FROM (
                SELECT FROM agent_events e
                WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.operation_id
                  AND e.operation_state_version = recorded
                  AND e.created_at >= born - interval '1 day'
                LIMIT 2) twice;
        END IF;
    END IF;
    IF n IS NULL THEN
        RAISE EXCEPTION 'agentdb: event % records state_version % of % %, % (violates constraint "%")',
                NEW.id, recorded, TG_ARGV[0], coalesce(NEW.operation_id, NEW.task_id),
                CASE WHEN reached >= recorded THEN 'and is older than it'
                     ELSE 'a version it has not reached' END,
                TG_NAME
            USING ERRCODE = '23514', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    ELSIF n > 1 THEN
        -- Citus drops the constraint field of a worker's error: the name is in
        -- the message too (TG_NAME carries the shard id there; agentdb strips it).
        RAISE EXCEPTION 'agentdb: two events record state_version % of % % (violates constraint "%")',
                recorded, TG_ARGV[0], coalesce(NEW.operation_id, NEW.task_id), TG_NAME
            USING ERRCODE = '23505', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G8: agentdb_require_event (0004.events) for events by month: the lookup bounded
-- to the months since a day before the task or operation was created (its
-- events are never older: agentdb_event_records_once).
CREATE FUNCTION agentdb_require_event_by_month() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN
        RETURN NULL;
    END IF;
    IF TG_ARGV[0] = 'task' THEN
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.id
          AND e.task_state_version = NEW.state_version
          AND e.created_at >= NEW.created_at - interval '1 day';
    ELSE
        PERFORM 1 FROM agent_events e
        WHERE e.tenant_id = NEW.tenant_id AND e.operation_id = NEW.id
          AND e.operation_state_version = NEW.state_version
          AND e.created_at >= NEW.created_at - interval '1 day';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agentdb: % % reached state_version % (%) without an event',
                TG_ARGV[0], NEW.id, NEW.state_version, NEW.state
            USING ERRCODE = 'AG006', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- G8/G9: drop every month that is over and holds no row retained any more,
-- then create the month partitions from this month to p_ahead months on. A
-- month whose rows already sit in the DEFAULT partition is left there
-- (retention deletes them row by row). Owner only by default, like
-- agentdb_purge. The lock_timeout keeps a drop or a create (ACCESS EXCLUSIVE
-- on agent_events) from queueing event writes behind a long transaction:
-- such a month is reported 'busy, skipped' and tried again on the next run.
-- Drops come first, so a month is counted before this run holds any lock.
-- READ COMMITTED only: the check under the lock must see a row committed
-- while it waited, which a transaction snapshot would not. TimeZone and
-- DateStyle are fixed, so month bounds are written and read back in UTC.
CREATE FUNCTION agentdb_event_partitions(p_ahead integer)
    RETURNS TABLE (partition_name text, action text, events bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET lock_timeout = '2s' SET "TimeZone" = 'UTC' SET "DateStyle" = 'ISO, YMD'
AS $$
DECLARE
    parent regclass := 'agent_events'::regclass;
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = 'agent_events'::regclass);
    month timestamptz := date_trunc('month', now(), 'UTC');
    lo timestamptz;
    part record;
    upper_bound timestamptz;
    retained boolean;
    -- Whether a month still holds a row within its retention.
    holds_retained constant text := 'SELECT EXISTS (SELECT 1 FROM %s WHERE retain_until > now())';
    n bigint;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = parent) <> 'p' THEN
        RETURN;  -- one table (agentdb_partition_events() not run): no month to keep
    END IF;
    IF p_ahead IS NULL OR p_ahead < 0 OR p_ahead > 24 THEN
        RAISE EXCEPTION 'agentdb: months ahead must be between 0 and 24, not %', p_ahead
            USING ERRCODE = '22023';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'agentdb: agentdb_event_partitions runs at READ COMMITTED, not %',
                current_setting('transaction_isolation')
            USING ERRCODE = '25000',
                  HINT = 'a snapshot taken before a late insert into a month would let the month be dropped with it';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;

    FOR part IN
        SELECT c.oid::regclass AS rel, c.relname,
               pg_get_expr(c.relpartbound, c.oid) AS bound
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent
        ORDER BY c.relname
    LOOP
        CONTINUE WHEN part.bound = 'DEFAULT';
        upper_bound := (regexp_match(part.bound, 'TO \(''([^'']+)''\)$'))[1]::timestamptz;
        -- Rows keep arriving in a month until it is over.
        CONTINUE WHEN upper_bound IS NULL OR upper_bound > now();
        EXECUTE format(holds_retained, part.rel) INTO STRICT retained;
        CONTINUE WHEN retained;
        EXECUTE format('SELECT count(*) FROM %s', part.rel) INTO STRICT n;
        partition_name := part.relname;
        BEGIN
            LOCK TABLE agent_events IN ACCESS EXCLUSIVE MODE;
            -- Again under the lock: a late insert may carry a longer retention.
            EXECUTE format(holds_retained, part.rel) INTO STRICT retained;
            CONTINUE WHEN retained;
            EXECUTE format('DROP TABLE %s', part.rel);
            action := 'dropped';
            events := n;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            action := 'busy, skipped';
            events := 0;
        END;
        RETURN NEXT;
    END LOOP;

    FOR i IN 0..p_ahead LOOP
        lo := month + make_interval(months => i);
        partition_name := 'agent_events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYY_MM');
        CONTINUE WHEN to_regclass(format('%I.%I', nsp, partition_name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           nsp, partition_name, parent, lo, lo + interval '1 month');
            EXECUTE format('CREATE TRIGGER agent_events_no_truncate BEFORE TRUNCATE ON %I.%I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only()',
                           nsp, partition_name);
            action := 'created';
        EXCEPTION
            -- The month lies in the legacy partition's range.
            WHEN invalid_object_definition THEN
                CONTINUE;
            -- Rows of that month already sit in the DEFAULT partition.
            WHEN check_violation THEN
                action := 'left in the default partition';
            -- Another session holds agent_events, or created the month first.
            WHEN lock_not_available OR deadlock_detected OR duplicate_table THEN
                action := 'busy, skipped';
        END;
        events := 0;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION agentdb_event_partitions(integer) FROM PUBLIC;

-- Events by month, opt-in: `agentdb migrate --events-by-month`, or CALL
-- agentdb_partition_events() as the owner. Does nothing (a NOTICE) if
-- agent_events is partitioned already.
CREATE PROCEDURE agentdb_partition_events()
    LANGUAGE plpgsql
AS $$
DECLARE
    cutover timestamptz := date_trunc('month', now(), 'UTC') + interval '1 month';
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) = 'p' THEN
        RAISE NOTICE 'agentdb: agent_events is partitioned by month already';
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    -- The old table, renamed; its name comes back as the partitioned table.
    ALTER TABLE agent_events RENAME TO agent_events_legacy;
    ALTER INDEX agent_events_retain_until_idx RENAME TO agent_events_legacy_retain_until_idx;
    ALTER INDEX agent_events_payload_expiry_idx RENAME TO agent_events_legacy_payload_expiry_idx;
    ALTER TABLE agent_events_legacy DROP CONSTRAINT agent_events_pkey;
    DROP INDEX agent_events_task_version_key;
    DROP INDEX agent_events_operation_version_key;
    -- Row triggers come back as clones of the partitioned table's.
    DROP TRIGGER agent_events_append_only ON agent_events_legacy;
    -- The ids: a new sequence, owned by the partitioned table, going on where
    -- the old one stopped (nothing draws from it in between: the table is
    -- locked). The old one stays with the legacy partition and goes with it -
    -- Citus cannot give a distributed table's sequence another owner. The two
    -- swap names at the end: on Citus, renaming a sequence before a table using
    -- the other is distributed deadlocks with the distribution's own connections.
    CREATE SEQUENCE agent_events_id_seq_by_month AS bigint;
    PERFORM setval('agent_events_id_seq_by_month', s.last_value, s.is_called) FROM agent_events_id_seq s;

    CREATE TABLE agent_events (
        LIKE agent_events_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    ) PARTITION BY RANGE (created_at);
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_by_month');
    ALTER SEQUENCE agent_events_id_seq_by_month OWNED BY agent_events.id;
    -- An insert naming the old table would draw ids the new sequence hands out
    -- again: without a default there, it must name its id.
    ALTER TABLE agent_events_legacy ALTER COLUMN id DROP DEFAULT;

    CALL agentdb_distribute_like('agent_events_legacy', 'agent_events');

    -- G15: the old table's grants and policies move to agent_events.
    CALL agentdb_move_access('agent_events_legacy', 'agent_events', true);
    ALTER TABLE agent_events_legacy NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE agent_events_legacy DISABLE ROW LEVEL SECURITY;

    ALTER TABLE agent_events ADD CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id, created_at);
    -- G2
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_operation_fkey
        FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_operations (tenant_id, id);
    -- G8: the lookups of the deferred event checks and of a task's or an
    -- operation's events (no longer unique: see the triggers below).
    CREATE INDEX agent_events_task_version_key
        ON agent_events (tenant_id, task_id, task_state_version);
    CREATE INDEX agent_events_operation_version_key
        ON agent_events (tenant_id, operation_id, operation_state_version)
        WHERE operation_id IS NOT NULL;
    -- G9: the retention paths.
    CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
    CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
        WHERE payload IS NOT NULL;

    -- G8: append-only, as one table is - the row triggers are cloned onto every partition.
    CREATE TRIGGER agent_events_append_only
        BEFORE UPDATE OR DELETE ON agent_events
        FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

    CREATE CONSTRAINT TRIGGER agent_events_task_version_key
        AFTER INSERT ON agent_events
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.task_state_version IS NOT NULL)
        EXECUTE FUNCTION agentdb_event_records_once('task');
    CREATE CONSTRAINT TRIGGER agent_events_operation_version_key
        AFTER INSERT ON agent_events
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW WHEN (NEW.operation_state_version IS NOT NULL)
        EXECUTE FUNCTION agentdb_event_records_once('operation');

    -- The old table becomes the partition for everything before next month
    -- (UTC); a row of it dated later (an explicit created_at) moves first to the
    -- DEFAULT partition, made here as a plain table (no guard on the old table
    -- now: its append-only trigger was dropped above and comes back as a clone).
    CREATE TABLE agent_events_default (LIKE agent_events_legacy INCLUDING CONSTRAINTS);
    CALL agentdb_distribute_like('agent_events_legacy', 'agent_events_default');
    INSERT INTO agent_events_default SELECT * FROM agent_events_legacy WHERE created_at >= cutover;
    DELETE FROM agent_events_legacy WHERE created_at >= cutover;
    EXECUTE format('ALTER TABLE agent_events ATTACH PARTITION agent_events_legacy '
                       'FOR VALUES FROM (MINVALUE) TO (%L)',
                       to_char(cutover AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || '+00');
    ALTER TABLE agent_events ATTACH PARTITION agent_events_default DEFAULT;
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events_default
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();
    PERFORM count(*) FROM agentdb_event_partitions(2);

    -- USAGE on the ids goes with them.
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_by_month', false);
    ALTER SEQUENCE agent_events_id_seq RENAME TO agent_events_legacy_id_seq;
    ALTER SEQUENCE agent_events_id_seq_by_month RENAME TO agent_events_id_seq;

    -- G15 (the policies came over from the old table above)
    ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
    ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;


    -- G8: the deferred check that a state change has its event looks in the
    -- task's months only.
    DROP TRIGGER agent_tasks_event_required ON agent_tasks;
    CREATE CONSTRAINT TRIGGER agent_tasks_event_required
        AFTER INSERT OR UPDATE ON agent_tasks
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event_by_month('task');
    DROP TRIGGER agent_operations_event_required ON agent_operations;
    CREATE CONSTRAINT TRIGGER agent_operations_event_required
        AFTER INSERT OR UPDATE ON agent_operations
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event_by_month('operation');
END
$$;

-- Back to one table: every row copied out of the partitions (a rewrite of
-- the audit trail, under ACCESS EXCLUSIVE for as long as the copy takes),
-- one event per version a unique index again. Does nothing if agent_events
-- is one table. The rollback of this migration runs it.
CREATE PROCEDURE agentdb_unpartition_events()
    LANGUAGE plpgsql
AS $$
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'agent_events'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    ALTER TABLE agent_events RENAME TO agent_events_by_month;
    ALTER INDEX agent_events_retain_until_idx RENAME TO agent_events_by_month_retain_until_idx;
    ALTER INDEX agent_events_payload_expiry_idx RENAME TO agent_events_by_month_payload_expiry_idx;
    -- (Dropped, not renamed: Citus cannot rename a distributed table's constraint.)
    ALTER TABLE agent_events_by_month DROP CONSTRAINT agent_events_pkey;

    -- A new id sequence, as the conversion made one (Citus cannot give a distributed
    -- table's sequence another owner); it takes the old name once the old one
    -- is gone with its table.
    CREATE SEQUENCE agent_events_id_seq_one_table AS bigint;
    PERFORM setval('agent_events_id_seq_one_table', s.last_value, s.is_called) FROM agent_events_id_seq s;
    CALL agentdb_move_access('agent_events_id_seq', 'agent_events_id_seq_one_table', false);

    CREATE TABLE agent_events (
        LIKE agent_events_by_month INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
    );
    ALTER TABLE agent_events ALTER COLUMN id SET DEFAULT nextval('agent_events_id_seq_one_table');
    ALTER SEQUENCE agent_events_id_seq_one_table OWNED BY agent_events.id;
    CALL agentdb_distribute_like('agent_events_by_month', 'agent_events');
    INSERT INTO agent_events SELECT * FROM agent_events_by_month;
    -- G15: grants and policies go with the table, as the conversion moved them.
    CALL agentdb_move_access('agent_events_by_month', 'agent_events', false);
    DROP TABLE agent_events_by_month;
    ALTER SEQUENCE agent_events_id_seq_one_table RENAME TO agent_events_id_seq;

    ALTER TABLE agent_events ADD CONSTRAINT agent_events_pkey PRIMARY KEY (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY (tenant_id, task_id)
        REFERENCES agent_tasks (tenant_id, id);
    ALTER TABLE agent_events ADD CONSTRAINT agent_events_operation_fkey
        FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_operations (tenant_id, id);
    CREATE UNIQUE INDEX agent_events_task_version_key
        ON agent_events (tenant_id, task_id, task_state_version);
    CREATE UNIQUE INDEX agent_events_operation_version_key
        ON agent_events (tenant_id, operation_id, operation_state_version)
        WHERE operation_id IS NOT NULL;
    CREATE INDEX agent_events_retain_until_idx ON agent_events (retain_until);
    CREATE INDEX agent_events_payload_expiry_idx ON agent_events (payload_expires_at)
        WHERE payload IS NOT NULL;
    CREATE TRIGGER agent_events_append_only
        BEFORE UPDATE OR DELETE ON agent_events
        FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();
    CREATE TRIGGER agent_events_no_truncate
        BEFORE TRUNCATE ON agent_events
        FOR EACH STATEMENT EXECUTE FUNCTION agentdb_guard_append_only();

    DROP TRIGGER agent_tasks_event_required ON agent_tasks;
    CREATE CONSTRAINT TRIGGER agent_tasks_event_required
        AFTER INSERT OR UPDATE ON agent_tasks
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('task');
    DROP TRIGGER agent_operations_event_required ON agent_operations;
    CREATE CONSTRAINT TRIGGER agent_operations_event_required
        AFTER INSERT OR UPDATE ON agent_operations
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION agentdb_require_event('operation');

    ALTER TABLE agent_events ENABLE ROW LEVEL SECURITY;
    ALTER TABLE agent_events FORCE ROW LEVEL SECURITY;
END
$$;


REVOKE EXECUTE ON PROCEDURE agentdb_partition_events() FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE agentdb_unpartition_events() FROM PUBLIC;

CALL agentdb_pin_search_paths();
