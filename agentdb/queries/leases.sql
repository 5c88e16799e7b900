-- Leases on tasks (G12). Every statement a holder runs names its lease
-- (owner + token); a holder whose lease was taken over matches nothing.
--
-- Held snapshots. A statement that writes one row by its key (a fence, a
-- settle, a mark) tests the row's state in a form no partial index on state
-- can answer: a lease by its owner alone (only a running task has one:
-- agent_tasks_running_is_leased), a state as NOT IN the others or as
-- array_position. The planner prices those indexes by the few live rows in a
-- transient state and would scan one for a single row; while any snapshot is
-- held (a long report, a forgotten transaction) nothing can remove the
-- entries of the rows that left the state, and that scan walks all of them -
-- per row, per statement. A primary key holds one entry per version of the
-- row it looks for. tests/test_held_snapshot.py counts what each holder's
-- statement reads. The claim cannot do without the due index: its walk must
-- find each tenant's first due task, and under a held snapshot that read
-- passes the entries of every task claimed since. It passes them once: the
-- batch's own read starts where the walk found that task, and a walk that
-- wrapped around looks only at the tenants it has not seen (lease_claim).

-- name: lease_bury_exhausted :many
-- Move tasks that used up their attempts and are not held by a live lease to
-- 'dead', with their event. Running tasks qualify only once their lease
-- expired, so a worker still inside its last attempt is never buried.
-- guarantee: G6, G8
-- params: $1 actor_id text, $2 batch int8
WITH victims AS (
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE attempts >= max_attempts
      AND ((state = 'running' AND lease_expires_at <= now())
           OR (state IN ('pending', 'waiting') AND wake_at <= now()))
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), buried AS (
    UPDATE agent_tasks t
    SET state = 'dead', state_version = t.state_version + 1, lease_owner = NULL,
        lease_acquired_at = NULL, lease_expires_at = NULL, updated_at = now()
    FROM victims v
    WHERE t.tenant_id = v.tenant_id AND t.id = v.id
    RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.attempts,
              t.trace_id, t.span_id, v.from_state
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, 'task.dead', $1, workflow_version, from_state, state,
           state_version, jsonb_build_object('attempts', attempts), trace_id, span_id
    FROM buried
)
SELECT tenant_id, id FROM buried;

-- name: lease_claim :many
-- Lease up to $2 due tasks to worker $1, shared fairly between tenants (G18):
-- running tasks whose lease expired first (recovery), then a round-robin
-- walk over the tenants with due work, starting after tenant $5 (the worker
-- passes the tenant of the last task it was given, so successive claims
-- rotate). The walk steps through agent_tasks_due_idx one (tenant, task
-- type) at a time - one index probe each, whatever the backlog - and stops
-- after $2 tenants that have a due task this worker may take and a free
-- slot, or after one full turn. Each of those tenants offers up to its share
-- of the batch (ceil($2 / tenants), never more than its caps leave free),
-- and the batch takes the tenants' first tasks, then their second, and so
-- on. A tenant's caps are locked FOR UPDATE SKIP LOCKED, so two claimers
-- never fill the same tenant's slots at once (a tenant whose caps another
-- claimer holds waits for the next claim), and agentdb_running_count counts
-- with a fresh snapshot. Each claim takes a new lease token, counts an
-- attempt and writes its event. Rows come back in the order the batch took
-- them. Tasks that used up their attempts are left to lease_bury_exhausted,
-- tasks past their deadline (G21: never claimed, not even counted by the walk,
-- so they take no tenant's turn) to lease_expire_deadlines.
-- guarantee: G18, G12, G7, G8
-- zero rows: nothing is due that this worker may take (or all of it is locked by other claimers).
-- params: $1 lease_owner text, $2 batch int4, $3 lease_ttl interval, $4 task_types text[], $5 after_tenant uuid
WITH RECURSIVE walk (step, tenant_id, task_type, takeable, wrapped, found, last_due,
                     first_wake) AS (
    SELECT 1, f.tenant_id, f.task_type, f.takeable, f.wrapped,
           CASE WHEN f.takeable THEN 1 ELSE 0 END,
           CASE WHEN f.takeable THEN f.tenant_id END,
           f.wake_at
    FROM ((SELECT t.tenant_id, t.task_type, t.wake_at, false AS wrapped
           FROM agent_tasks t
           WHERE t.state IN ('pending', 'waiting') AND t.attempts < t.max_attempts
             AND (t.deadline_at IS NULL OR t.deadline_at > now())
             AND t.tenant_id > coalesce($5, '00000000-0000-0000-0000-000000000000'::uuid)
           ORDER BY t.tenant_id, t.task_type, t.wake_at
           LIMIT 1)
          UNION ALL
          (SELECT t.tenant_id, t.task_type, t.wake_at, true
           FROM agent_tasks t
           WHERE t.state IN ('pending', 'waiting') AND t.attempts < t.max_attempts
             AND (t.deadline_at IS NULL OR t.deadline_at > now())
           ORDER BY t.tenant_id, t.task_type, t.wake_at
           LIMIT 1)
          LIMIT 1) n0
    CROSS JOIN LATERAL (
        SELECT n0.tenant_id, n0.task_type, n0.wake_at, n0.wrapped,
               n0.wake_at <= now() AND ($4::text[] IS NULL OR n0.task_type = ANY ($4))
               AND NOT EXISTS (
                   SELECT 1 FROM agent_concurrency_limits l
                   WHERE l.tenant_id = n0.tenant_id AND l.task_type IN ('*', n0.task_type)
                     AND l.max_running <= (
                         SELECT count(*) FROM agent_tasks r
                         WHERE r.tenant_id = l.tenant_id AND r.state = 'running'
                           AND (l.task_type = '*' OR r.task_type = l.task_type))) AS takeable
    ) f
    UNION ALL
    SELECT w.step + 1, f.tenant_id, f.task_type, f.takeable, f.wrapped,
           w.found + CASE WHEN f.takeable AND f.tenant_id IS DISTINCT FROM w.last_due
                          THEN 1 ELSE 0 END,
           CASE WHEN f.takeable THEN f.tenant_id ELSE w.last_due END,
           f.wake_at
    FROM walk w
    CROSS JOIN LATERAL (
        (SELECT t.tenant_id, t.task_type, t.wake_at, w.wrapped AS wrapped
         FROM agent_tasks t
         WHERE t.state IN ('pending', 'waiting') AND t.attempts < t.max_attempts
           AND (t.deadline_at IS NULL OR t.deadline_at > now())
           AND (t.tenant_id, t.task_type) > (w.tenant_id, w.task_type)
         ORDER BY t.tenant_id, t.task_type, t.wake_at
         LIMIT 1)
        UNION ALL
        (SELECT t.tenant_id, t.task_type, t.wake_at, true
         FROM agent_tasks t
         WHERE NOT w.wrapped AND t.state IN ('pending', 'waiting')
           AND t.attempts < t.max_attempts AND (t.deadline_at IS NULL OR t.deadline_at > now())
           -- Back at the start, only a tenant up to $5 may go on (the WHERE below
           -- stops at any other): one further from it is not looked for at all,
           -- so a walk that found every tenant before it wrapped does not read a
           -- tenant's head of the queue a second time (under a held snapshot,
           -- the entries of every task claimed since).
           AND t.tenant_id <= coalesce($5, '00000000-0000-0000-0000-000000000000'::uuid)
         ORDER BY t.tenant_id, t.task_type, t.wake_at
         LIMIT 1)
        LIMIT 1
    ) n
    CROSS JOIN LATERAL (
        SELECT n.tenant_id, n.task_type, n.wake_at, n.wrapped,
               n.wake_at <= now() AND ($4::text[] IS NULL OR n.task_type = ANY ($4))
               AND NOT EXISTS (
                   SELECT 1 FROM agent_concurrency_limits l
                   WHERE l.tenant_id = n.tenant_id AND l.task_type IN ('*', n.task_type)
                     AND l.max_running <= (
                         SELECT count(*) FROM agent_tasks r
                         WHERE r.tenant_id = l.tenant_id AND r.state = 'running'
                           AND (l.task_type = '*' OR r.task_type = l.task_type))) AS takeable
    ) f
    -- Go on until enough tenants (finishing the last one's task types), and
    -- stop when the walk is back where it began.
    WHERE (w.found < $2 OR n.tenant_id = w.tenant_id)
      AND NOT (n.wrapped AND n.tenant_id > coalesce($5, '00000000-0000-0000-0000-000000000000'::uuid))
), due_pairs AS (
    SELECT tenant_id, task_type, step, first_wake FROM walk WHERE takeable
), due AS (
    SELECT tenant_id, min(step) AS step
    FROM due_pairs
    GROUP BY tenant_id
    ORDER BY min(step)
    LIMIT $2
), caps AS (
    SELECT l.tenant_id, l.task_type, l.max_running
    FROM agent_concurrency_limits l
    WHERE l.tenant_id IN (SELECT tenant_id FROM due) AND l.max_running IS NOT NULL
    ORDER BY l.tenant_id, l.task_type
    FOR UPDATE SKIP LOCKED
), free AS (
    SELECT c.tenant_id, c.task_type,
           c.max_running - agentdb_running_count(c.tenant_id, c.task_type) AS slots
    FROM caps c
), held_elsewhere AS (
    SELECT l.tenant_id
    FROM agent_concurrency_limits l
    WHERE l.tenant_id IN (SELECT tenant_id FROM due) AND l.max_running IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM caps c
                      WHERE c.tenant_id = l.tenant_id AND c.task_type = l.task_type)
), share AS (
    SELECT d.tenant_id, d.step,
           greatest(0, least((SELECT ($2 + count(*) - 1) / count(*) FROM due),
                             (SELECT f.slots FROM free f
                              WHERE f.tenant_id = d.tenant_id AND f.task_type = '*'))) AS n
    FROM due d
    WHERE d.tenant_id NOT IN (SELECT tenant_id FROM held_elsewhere)
), offered AS (
    SELECT o.tenant_id, o.id, o.task_type, o.wake_at, o.from_state, s.step
    FROM share s
    JOIN due_pairs p ON p.tenant_id = s.tenant_id
    CROSS JOIN LATERAL (
        SELECT t.tenant_id, t.id, t.task_type, t.wake_at, t.state AS from_state
        FROM agent_tasks t
        WHERE t.tenant_id = p.tenant_id AND t.task_type = p.task_type
          AND t.state IN ('pending', 'waiting') AND t.wake_at <= now()
          AND t.attempts < t.max_attempts
          -- G21: past its deadline a task is never claimed (the sweep ends it).
          AND (t.deadline_at IS NULL OR t.deadline_at > now())
          -- From where the walk found the pair's first task, in this statement's
          -- snapshot and by these same tests: none of the pair's tasks comes
          -- before it, so this takes what it took without it, but its range
          -- starts there. Under a held snapshot the index keeps an entry for
          -- every task claimed since, ahead of the live ones; the walk has
          -- read past them once, and this read does not again.
          AND t.wake_at >= p.first_wake
        ORDER BY t.wake_at
        LIMIT least(s.n, (SELECT greatest(0, f.slots) FROM free f
                          WHERE f.tenant_id = p.tenant_id AND f.task_type = p.task_type))
        FOR UPDATE SKIP LOCKED
    ) o
), ranked AS (
    SELECT o.tenant_id, o.id, o.from_state, o.step,
           row_number() OVER (PARTITION BY o.tenant_id ORDER BY o.wake_at, o.id) AS nth
    FROM offered o
), expired AS (
    -- Running tasks whose lease expired, tested by the expiry alone (only a
    -- running task has a lease: agent_tasks_running_is_leased), so that only
    -- agent_tasks_lease_expiry_idx's range of expiries can answer it, never a
    -- whole read of agent_tasks_running_idx (0022.lease_expiry's header).
    SELECT tenant_id, id, state AS from_state
    FROM agent_tasks
    WHERE lease_expires_at <= now() AND attempts < max_attempts
      AND ($4::text[] IS NULL OR task_type = ANY ($4))
      AND (deadline_at IS NULL OR deadline_at > now())
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT tenant_id, id, from_state, ord
    FROM ((SELECT tenant_id, id, from_state, 0::int8 AS ord FROM expired)
          UNION ALL
          (SELECT r.tenant_id, r.id, r.from_state, row_number() OVER (ORDER BY r.nth, r.step)
           FROM ranked r JOIN share s ON s.tenant_id = r.tenant_id
           WHERE r.nth <= s.n)) p
    ORDER BY ord
    LIMIT $2
), claimed AS (
    UPDATE agent_tasks t
    SET state = 'running',
        state_version = t.state_version + 1,
        lease_owner = $1,
        lease_token = t.lease_token + 1,
        lease_acquired_at = now(),
        lease_expires_at = now() + coalesce($3, t.lease_ttl),
        attempts = t.attempts + 1,
        updated_at = now()
    FROM picked p
    WHERE t.tenant_id = p.tenant_id AND t.id = p.id
    RETURNING t.id, t.tenant_id, t.task_type, t.workflow_version, t.state, t.state_version,
              t.current_step, t.wake_at, t.dedupe_key, t.input_hash, t.params, t.attempts,
              t.max_attempts, t.last_error, t.lease_ttl, t.lease_owner, t.lease_token,
              t.lease_acquired_at, t.lease_expires_at, t.deadline_at, t.trace_id, t.span_id, t.created_at,
              t.updated_at, p.from_state, p.ord
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id,
           CASE WHEN from_state = 'running' THEN 'task.reclaimed' ELSE 'task.claimed' END,
           lease_owner, workflow_version, from_state, state, state_version,
           jsonb_build_object('lease_token', lease_token, 'attempt', attempts),
           trace_id, span_id
    FROM claimed
)
SELECT id, tenant_id, task_type, workflow_version, state, state_version, current_step,
       wake_at, dedupe_key, input_hash, params, attempts, max_attempts, last_error,
       lease_ttl, lease_owner, lease_token, lease_acquired_at, lease_expires_at, deadline_at,
       trace_id, span_id, created_at, updated_at
FROM claimed
ORDER BY ord;

-- name: lease_expire_deadlines :many
-- Move unfinished tasks whose deadline has passed to 'dead', with their
-- event (task.deadline_passed): a running one loses its lease in the same
-- write, so its holder's next write is refused (G21). At most $2 tasks, the
-- earliest deadlines first; rows another writer holds are left for the next
-- sweep.
-- guarantee: G21, G8
-- params: $1 actor_id text, $2 batch int8
WITH victims AS (
    -- The instant in UTC, whatever the session's TimeZone (as the Citus form writes it).
    SELECT tenant_id, id, state AS from_state, lease_owner AS holder,
           to_char(deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS deadline
    FROM agent_tasks
    WHERE deadline_at <= now() AND deadline_at IS NOT NULL
      AND state IN ('pending', 'waiting', 'running')
    ORDER BY deadline_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE agent_tasks t
    SET state = 'dead', state_version = t.state_version + 1, lease_owner = NULL,
        lease_acquired_at = NULL, lease_expires_at = NULL,
        last_error = 'deadline passed at ' || v.deadline, updated_at = now()
    FROM victims v
    WHERE t.tenant_id = v.tenant_id AND t.id = v.id
    RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, v.deadline,
              t.trace_id, t.span_id, v.from_state, v.holder
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, 'task.deadline_passed', $1, workflow_version, from_state, state,
           state_version,
           jsonb_strip_nulls(jsonb_build_object('deadline_at', deadline, 'lease_owner', holder)),
           trace_id, span_id
    FROM moved
)
SELECT tenant_id, id FROM moved;

-- name: lease_held :many
-- Which of the tasks $2 (in tenants $1) worker $3 still runs, with the lease
-- token it holds each by: the worker's lease watch asks once a second while
-- it runs jobs, so a cancel (G20) or the deadline sweep (G21) - which drop
-- the lease in their own write - stops a handler within about a second,
-- not after a third of its lease. One row per task still held; a task that
-- is not among them, or under another token, is no longer this worker's.
-- On Citus, tenant_id = ANY ($1) prunes the read to the tenants' shards.
-- guarantee: G12, G20, G21
-- params: $1 tenant_ids uuid[], $2 ids uuid[], $3 lease_owner text
SELECT id, lease_token
FROM agent_tasks
WHERE tenant_id = ANY ($1) AND id = ANY ($2) AND lease_owner = $3;

-- name: lease_release :one
-- Give the task back: running -> pending (due at $5, default now), or
-- 'dead' if it has used its attempts and $6 is false. With $6 (a graceful
-- shutdown) the attempt is refunded so the next worker's claim does not
-- count it twice. Writes the event.
-- guarantee: G12, G7, G8
-- zero rows: the lease is gone - another worker took the task over, or it left 'running'.
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_owner text, $4 lease_token int8, $5 wake_at timestamptz, $6 refund_attempt bool, $7 last_error text, $8 event_type text
WITH upd AS (
    UPDATE agent_tasks t
    SET state = CASE WHEN NOT $6 AND t.attempts >= t.max_attempts THEN 'dead' ELSE 'pending' END,
        state_version = t.state_version + 1,
        wake_at = coalesce($5, now()),
        attempts = CASE WHEN $6 THEN t.attempts - 1 ELSE t.attempts END,
        last_error = coalesce($7, t.last_error),
        lease_owner = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE t.tenant_id = $1 AND t.id = $2
      AND t.lease_owner = $3 AND t.lease_token = $4  -- running (see "Held snapshots")
    RETURNING t.tenant_id, t.id, t.workflow_version, t.state, t.state_version, t.wake_at,
              t.attempts, t.trace_id, t.span_id
), ev AS (
    INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,
                              from_state, to_state, task_state_version, payload, trace_id,
                              span_id)
    SELECT tenant_id, id, $8, $3, workflow_version, 'running', state, state_version,
           jsonb_build_object('lease_token', $4::int8, 'attempts', attempts), trace_id, span_id
    FROM upd
)
SELECT state, state_version, wake_at, attempts FROM upd;

-- name: lease_renew :one
-- Extend the caller's lease. Changes only lease_expires_at (and updated_at),
-- so it does not bump state_version (the one exception the version guard
-- allows). An expired lease that nobody took over can still be renewed: the
-- token, not the clock, is the fence.
-- guarantee: G12
-- zero rows: the lease is gone - another worker took the task over, or it left 'running'; stop working on it.
-- params: $1 tenant_id uuid, $2 id uuid, $3 lease_owner text, $4 lease_token int8, $5 lease_ttl interval
UPDATE agent_tasks
SET lease_expires_at = now() + coalesce($5, lease_ttl), updated_at = now()
WHERE tenant_id = $1 AND id = $2
  AND lease_owner = $3 AND lease_token = $4  -- running (see "Held snapshots")
RETURNING lease_expires_at;
