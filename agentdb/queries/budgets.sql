-- Budgets and rate limits (G19): what an operator sets and status reads;
-- the hold a re-armed retry takes; what a refusal reads and records. A
-- reservation's own hold, and its settlement, are taken in the operation
-- statements themselves (operations.sql), in the same statement.

-- name: budget_hold :many
-- Hold cost ($4 units, $5 amounts) for attempt $3 of tenant $1's operation
-- $2 on every budget of those units that covers the tenant or the
-- operation's task: the hold a re-armed retry of a failed operation needs
-- before it is re-armed, in the same transaction. The CHECK
-- agent_budgets_within_limit refuses a hold over a limit. One row per
-- budget held; none when no budget covers these units.
-- guarantee: G19
-- params: $1 tenant_id uuid, $2 operation_id uuid, $3 attempt int4, $4 units text[], $5 amounts int8[]
WITH cost AS (
    SELECT c.unit, c.amount FROM unnest($4::text[], $5::int8[]) AS c (unit, amount)
), locked AS (
    SELECT b.id, c.amount
    FROM agent_budgets b JOIN cost c ON c.unit = b.unit
    JOIN agent_operations o ON o.tenant_id = $1 AND o.id = $2
    WHERE b.tenant_id = $1 AND (b.task_id IS NULL OR b.task_id = o.task_id)
    ORDER BY b.id
    FOR UPDATE OF b
), held AS (
    UPDATE agent_budgets b
    SET held = b.held + l.amount, updated_at = now()
    FROM locked l
    WHERE b.tenant_id = $1 AND b.id = l.id
    RETURNING b.id, b.unit, l.amount
), hold AS (
    INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id, unit, amount)
    SELECT $1, $2, $3, h.id, h.unit, h.amount FROM held h
)
SELECT h.id AS budget_id, h.unit, h.amount FROM held h;

-- name: budget_left :many
-- What each budget of tenant $1 covering task $2 in units $3 still allows
-- (limit - spent - held, with a window that has rolled over counted as
-- unspent): the "remaining" of a BudgetExceeded. A lock-free read.
-- guarantee: G19
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 units text[]
SELECT b.id, b.unit, b.task_id, b.period, b.limit_amount, b.spent, b.held,
       b.limit_amount - b.held - CASE
           WHEN b.period <> 'total' AND b.window_start < date_trunc(b.period, now(), 'UTC') THEN 0
           ELSE b.spent END AS remaining
FROM agent_budgets b
WHERE b.tenant_id = $1 AND (b.task_id IS NULL OR b.task_id = $2) AND b.unit = ANY ($3)
ORDER BY b.unit, b.id;

-- name: budget_list :many
-- Tenant $1's budgets (or every tenant's when NULL), with a window that has
-- rolled over shown as unspent. A lock-free read.
-- guarantee: G19
-- params: $1 tenant_id uuid
SELECT b.id, b.tenant_id, b.task_id, b.unit, b.period, b.limit_amount,
       CASE WHEN b.period <> 'total' AND b.window_start < date_trunc(b.period, now(), 'UTC')
            THEN 0 ELSE b.spent END AS spent,
       b.held, b.window_start
FROM agent_budgets b
WHERE $1::uuid IS NULL OR b.tenant_id = $1
ORDER BY b.tenant_id, b.unit, b.task_id NULLS FIRST;

-- name: budget_refused :execrows
-- The event of a reservation the budgets or rate limits refused (G19),
-- written after the refused statement rolled back: which key and action,
-- why, what was asked and what was left. No operation exists for it.
-- guarantee: G19, G8
-- zero rows: no such task in this tenant (nothing is written).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 actor_id text, $4 payload jsonb, $5 trace_id text, $6 span_id text
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, payload,
                          trace_id, span_id)
SELECT t.tenant_id, t.id, 'operation.refused', $3, t.workflow_version, $4, $5, $6
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.id = $2;

-- name: budget_refused_row :execrows
-- budget_refused on Citus: the event of a reservation the
-- budgets or rate limits refused (G19), one row of VALUES. Citus runs an
-- INSERT ... SELECT whose SELECT it does not prune at plan time through the
-- coordinator as a COPY, which row-level security refuses ("COPY FROM not
-- supported with row-level security"): the version comes first from
-- budget_refused_task, in the same transaction.
-- guarantee: G19, G8
-- zero rows: never; the insert either writes its row or raises.
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 actor_id text, $4 policy_version text, $5 payload jsonb, $6 trace_id text, $7 span_id text
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, payload,
                          trace_id, span_id)
VALUES ($1, $2, 'operation.refused', $3, $4, $5, $6, $7);

-- name: budget_refused_task :one
-- The workflow version of tenant $1's task $2: the policy_version an event
-- written without its task's UPDATE carries (budget_refused_row).
-- guarantee: G19, G8
-- zero rows: no such task in this tenant.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT t.workflow_version
FROM agent_tasks t
WHERE t.tenant_id = $1 AND t.id = $2;

-- name: budget_set :one
-- Set tenant $1's budget in unit $3 (for task $2, or the whole tenant when
-- NULL): its limit $4 and window $5. Changing the window starts a new one.
-- The CHECK agent_budgets_within_limit refuses a limit below what is spent
-- and held now.
-- guarantee: G19
-- zero rows: never (the upsert returns its row or raises).
-- params: $1 tenant_id uuid, $2 task_id uuid, $3 unit text, $4 limit_amount int8, $5 period text
INSERT INTO agent_budgets (tenant_id, task_id, unit, limit_amount, period)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id, task_id, unit)
DO UPDATE SET limit_amount = EXCLUDED.limit_amount, period = EXCLUDED.period
RETURNING id, tenant_id, task_id, unit, period, limit_amount, spent, held, window_start;

-- name: global_rate_limit_list :many
-- The global rate limits, as rate_limit_list (plain Postgres only).
-- guarantee: G19
-- params: none
SELECT NULL::uuid AS tenant_id, g.action, g.max_calls, g.per,
       CASE WHEN g.window_start + g.per <= now() THEN 0 ELSE g.used END AS used,
       g.window_start
FROM agent_global_rate_limits g
ORDER BY g.action;

-- name: global_rate_limit_set :one
-- rate_limit_set across every tenant (plain Postgres only).
-- guarantee: G19
-- zero rows: never (the upsert returns its row or raises).
-- params: $1 action text, $2 max_calls int4, $3 per interval
INSERT INTO agent_global_rate_limits (action, max_calls, per)
VALUES ($1, $2, $3)
ON CONFLICT (action)
DO UPDATE SET max_calls = EXCLUDED.max_calls, per = EXCLUDED.per,
              used = least(agent_global_rate_limits.used, EXCLUDED.max_calls),
              updated_at = EXCLUDED.updated_at
RETURNING NULL::uuid AS tenant_id, action, max_calls, per, used, window_start;

-- name: global_rate_window :many
-- rate_window for the global limit of action $1 (plain Postgres
-- only: there are no global limits on Citus).
-- guarantee: G19
-- params: $1 action text
SELECT date_bin(g.per, now(), timestamptz '2000-01-01 00:00:00+00') + g.per AS retry_after
FROM agent_global_rate_limits g
WHERE g.action = $1
  AND (g.max_calls = 0 OR (g.used >= g.max_calls AND g.window_start + g.per > now()));

-- name: rate_limit_list :many
-- Tenant $1's rate limits (every tenant's when NULL), with the calls counted
-- in the current window (0 once it has passed). A lock-free read.
-- guarantee: G19
-- params: $1 tenant_id uuid
SELECT r.tenant_id, r.action, r.max_calls, r.per,
       CASE WHEN r.window_start + r.per <= now() THEN 0 ELSE r.used END AS used,
       r.window_start
FROM agent_rate_limits r
WHERE $1::uuid IS NULL OR r.tenant_id = $1
ORDER BY r.tenant_id, r.action;

-- name: rate_limit_set :one
-- Allow tenant $1 at most $3 operations of action $2 per window of $4. The
-- calls already counted in the current window stay counted (capped at the
-- new limit).
-- guarantee: G19
-- zero rows: never (the upsert returns its row or raises).
-- params: $1 tenant_id uuid, $2 action text, $3 max_calls int4, $4 per interval
INSERT INTO agent_rate_limits (tenant_id, action, max_calls, per)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, action)
DO UPDATE SET max_calls = EXCLUDED.max_calls, per = EXCLUDED.per,
              used = least(agent_rate_limits.used, EXCLUDED.max_calls),
              updated_at = EXCLUDED.updated_at
RETURNING tenant_id, action, max_calls, per, used, window_start;

-- name: rate_window :many
-- The rate limits of action $2 for tenant $1 that are used up now, with
-- when their window ends (the aligned bin after the one holding now()): the
-- retry_after of a RateLimited. A lock-free read; no row means the window
-- has rolled over since the refusal - retry at once.
-- guarantee: G19
-- params: $1 tenant_id uuid, $2 action text
SELECT date_bin(r.per, now(), timestamptz '2000-01-01 00:00:00+00') + r.per AS retry_after
FROM agent_rate_limits r
WHERE r.tenant_id = $1 AND r.action = $2
  AND (r.max_calls = 0 OR (r.used >= r.max_calls AND r.window_start + r.per > now()));
