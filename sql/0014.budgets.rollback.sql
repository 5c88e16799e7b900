-- Back to 0013: the routines of 0012 and 0013 under their own names again,
-- no budgets, holds or rate limits.
DROP FUNCTION agentdb_purge(text, integer, interval);
ALTER FUNCTION agentdb_purge_0013(text, integer, interval) RENAME TO agentdb_purge;
DROP FUNCTION agentdb_purge_tenant(uuid, text, integer, interval);
ALTER FUNCTION agentdb_purge_tenant_0013(uuid, text, integer, interval) RENAME TO agentdb_purge_tenant;
DROP FUNCTION agentdb_purge_books(uuid, text, integer, interval);
DROP PROCEDURE agentdb_distribute(integer);
ALTER PROCEDURE agentdb_distribute_0013(integer) RENAME TO agentdb_distribute;
DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
ALTER FUNCTION agentdb_delete_tenant_0012(uuid, boolean, text) RENAME TO agentdb_delete_tenant;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentdb_runtime') THEN
        REVOKE ALL ON agent_budgets, agent_budget_holds, agent_rate_limits,
                      agent_global_rate_limits FROM agentdb_runtime;
    END IF;
END
$$;
DROP PROCEDURE agentdb_grant_roles();
ALTER PROCEDURE agentdb_grant_roles_0012() RENAME TO agentdb_grant_roles;
DROP TRIGGER agent_operations_rate_limit ON agent_operations;
DROP TRIGGER agent_operations_rate_limit_retry ON agent_operations;
DROP FUNCTION agentdb_count_call();
DROP FUNCTION agentdb_rate_step(interval, timestamptz, integer);
DROP TABLE agent_budget_holds;
DROP TABLE agent_budgets;
DROP TABLE agent_rate_limits;
DROP TABLE agent_global_rate_limits;
DROP FUNCTION agentdb_guard_budget();
DROP FUNCTION agentdb_guard_budget_hold();

CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0013.citus'::text $$;

CALL agentdb_pin_search_paths();
