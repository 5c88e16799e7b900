-- Budgets and rate limits (G19): what an operator sets, and what status
-- reads. The holds themselves are taken and settled by the operation
-- statements (operations.sql), in the same statement as the operation.

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
              used = least(agent_rate_limits.used, EXCLUDED.max_calls), updated_at = now()
RETURNING tenant_id, action, max_calls, per, used, window_start;

-- name: global_rate_limit_set :one
-- rate_limit_set across every tenant (plain Postgres only).
-- guarantee: G19
-- zero rows: never (the upsert returns its row or raises).
-- params: $1 action text, $2 max_calls int4, $3 per interval
INSERT INTO agent_global_rate_limits (action, max_calls, per)
VALUES ($1, $2, $3)
ON CONFLICT (action)
DO UPDATE SET max_calls = EXCLUDED.max_calls, per = EXCLUDED.per,
              used = least(agent_global_rate_limits.used, EXCLUDED.max_calls), updated_at = now()
RETURNING NULL::uuid AS tenant_id, action, max_calls, per, used, window_start;

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

-- name: global_rate_limit_list :many
-- The global rate limits, as rate_limit_list (plain Postgres only).
-- guarantee: G19
-- params: none
SELECT NULL::uuid AS tenant_id, g.action, g.max_calls, g.per,
       CASE WHEN g.window_start + g.per <= now() THEN 0 ELSE g.used END AS used,
       g.window_start
FROM agent_global_rate_limits g
ORDER BY g.action;
