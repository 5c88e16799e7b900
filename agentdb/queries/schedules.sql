-- Schedules (G24): a task per tick of a rule, at most one per tick
-- (agent_tasks_schedule_tick_key), fired by agentdb_fire_schedule.

-- name: schedule_create :one
-- Create schedule $3 of tenant $1; its first tick is the first of the rule
-- at or after its anchor ($10, else now, in whole seconds). A retried create
-- of the same name inserts nothing and returns the schedule there
-- (created = false); the caller compares the definitions.
-- guarantee: G24, G2
-- zero rows: a concurrent create of the same name committed after this statement's snapshot was taken; run it again.
-- params: $1 tenant_id uuid, $2 id uuid, $3 name text, $4 task_type text, $5 workflow_version text, $6 params jsonb, $7 every interval, $8 cron text, $9 catch_up text, $10 start_at timestamptz, $11 task_deadline interval
WITH ins AS (
    INSERT INTO agent_schedules (tenant_id, id, name, task_type, workflow_version, params, every,
                                 cron, anchor, catch_up, task_deadline, next_tick_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, a.anchor, $9, $11,
           -- The anchor itself for a rule the CHECKs refuse (they say why, by name).
           coalesce(agentdb_schedule_tick($7, $8, a.anchor, a.anchor - interval '1 microsecond',
                                          true), a.anchor)
    FROM (SELECT date_trunc('second', coalesce($10, now())) AS anchor) a
    ON CONFLICT (tenant_id, name) DO NOTHING
    RETURNING id, tenant_id, name, task_type, workflow_version, params, every, cron, anchor,
              catch_up, task_deadline, paused, next_tick_at, last_tick_at, created_at, updated_at
)
SELECT true AS created, * FROM ins
UNION ALL
SELECT false, s.id, s.tenant_id, s.name, s.task_type, s.workflow_version, s.params, s.every,
       s.cron, s.anchor, s.catch_up, s.task_deadline, s.paused, s.next_tick_at, s.last_tick_at,
       s.created_at, s.updated_at
FROM agent_schedules s
WHERE s.tenant_id = $1 AND s.name = $3 AND NOT EXISTS (SELECT 1 FROM ins);

-- name: schedule_delete :one
-- Delete schedule $2 of tenant $1. The tasks it made stay, with its id and their ticks.
-- guarantee: G24
-- zero rows: no schedule of that name in this tenant.
-- params: $1 tenant_id uuid, $2 name text
DELETE FROM agent_schedules WHERE tenant_id = $1 AND name = $2 RETURNING id;

-- name: schedule_due :many
-- Up to $1 schedules due to fire (not paused, next tick passed), the most
-- overdue first (agent_schedules_due_idx).
-- guarantee: G24
-- zero rows: nothing is due.
-- params: $1 batch int8
SELECT tenant_id, id FROM agent_schedules
WHERE NOT paused AND next_tick_at <= now()
ORDER BY next_tick_at
LIMIT $1;

-- name: schedule_fire :many
-- Fire schedule $2 of tenant $1 if it is due (agentdb_fire_schedule): the
-- tasks its catch-up policy creates, with their events, in this statement.
-- guarantee: G24, G8
-- zero rows: not due, paused, held by another scheduler, or its ticks' tasks exist already.
-- params: $1 tenant_id uuid, $2 schedule_id uuid
SELECT fired_task, fired_tick FROM agentdb_fire_schedule($1, $2);

-- name: schedule_get :one
-- Schedule $2 of tenant $1.
-- guarantee: G24
-- zero rows: no schedule of that name in this tenant.
-- params: $1 tenant_id uuid, $2 name text
SELECT id, tenant_id, name, task_type, workflow_version, params, every, cron, anchor, catch_up,
       task_deadline, paused, next_tick_at, last_tick_at, created_at, updated_at
FROM agent_schedules WHERE tenant_id = $1 AND name = $2;

-- name: schedule_list :many
-- Tenant $1's schedules, by name.
-- guarantee: G24
-- zero rows: the tenant has none.
-- params: $1 tenant_id uuid
SELECT id, tenant_id, name, task_type, workflow_version, params, every, cron, anchor, catch_up,
       task_deadline, paused, next_tick_at, last_tick_at, created_at, updated_at
FROM agent_schedules WHERE tenant_id = $1 ORDER BY name;

-- name: schedule_pause :one
-- Pause schedule $2 of tenant $1 ($3 true) or resume it ($3 false)
-- (agentdb_pause_schedule: a resumed schedule's next tick is the first after
-- now if its own has passed, so the ticks of the pause are never fired).
-- guarantee: G24
-- zero rows: no schedule of that name in this tenant.
-- params: $1 tenant_id uuid, $2 name text, $3 paused bool
SELECT id, tenant_id, name, task_type, workflow_version, params, every, cron, anchor, catch_up,
       task_deadline, paused, next_tick_at, last_tick_at, created_at, updated_at
FROM agentdb_pause_schedule($1, $2, $3);
