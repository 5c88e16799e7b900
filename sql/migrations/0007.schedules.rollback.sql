-- Back to 0006: no schedules. A task a schedule made keeps its schedule_id
-- and schedule_tick, as history.
DROP TRIGGER agent_tasks_schedule_fixed ON agent_tasks;
DROP TRIGGER agent_tasks_schedule_guard ON agent_tasks;
DROP FUNCTION agentdb_pause_schedule(uuid, text, boolean);
DROP FUNCTION agentdb_fire_schedule(uuid, uuid);
DROP FUNCTION agentdb_guard_schedule_tick();
DROP TABLE agent_schedules;
DROP FUNCTION agentdb_schedule_is_tick(interval, text, timestamptz, timestamptz);
DROP FUNCTION agentdb_schedule_tick(interval, text, timestamptz, timestamptz, boolean);
DROP FUNCTION agentdb_cron_tick(text, timestamptz, boolean);
DROP FUNCTION agentdb_cron_valid(text);
DROP FUNCTION agentdb_cron_field(text, integer, integer);
