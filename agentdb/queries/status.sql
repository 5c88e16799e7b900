-- Operator status (agentdb status). Read-only diagnostics: no guarantee rests
-- on them. status_expired_leases, status_unsettled_operations, status_outbox
-- and the purge backlog are served by partial indexes; status_tasks,
-- status_tenants and status_inbox count every row of their table.

-- name: status_due :many
-- Tasks due now per tenant and how long the oldest has waited for a
-- worker: the delay fair claiming (G18) keeps short for every tenant.
-- guarantee: none
-- params: none
SELECT tenant_id, count(*) AS due, extract(epoch FROM now() - min(wake_at)) AS oldest
FROM agent_tasks
WHERE state IN ('pending', 'waiting') AND wake_at <= now()
GROUP BY tenant_id;

-- name: status_expired_leases :many
-- Running tasks whose lease expired and nobody has reclaimed yet.
-- guarantee: none
-- params: none
SELECT tenant_id, count(*) AS n
FROM agent_tasks
WHERE state = 'running' AND lease_expires_at < now()
GROUP BY tenant_id;

-- name: status_inbox :many
-- Inbox rows per tenant.
-- guarantee: none
-- params: none
SELECT tenant_id, count(*) AS n FROM agent_inbox GROUP BY tenant_id;

-- name: status_limits :many
-- Every concurrency cap (G18) and how many tasks it counts as running now.
-- guarantee: none
-- params: none
SELECT l.tenant_id, l.task_type, l.max_running,
       agentdb_running_count(l.tenant_id, l.task_type) AS running
FROM agent_concurrency_limits l
WHERE l.max_running IS NOT NULL;

-- name: status_oldest_transaction :one
-- The oldest open transaction in this database that holds back cleanup (a
-- snapshot or a transaction id): while it is open no row version the cycle
-- replaces can be removed, and every claim walks the versions of the tasks
-- taken since it began ("Held snapshots" in leases.sql). Other roles' sessions
-- show only to a role with pg_read_all_stats (or a superuser).
-- guarantee: none
-- zero rows: no other session of this database has a transaction open (that this role may see).
-- params: none
SELECT pid, usename AS login, application_name, state,
       extract(epoch FROM now() - xact_start) AS seconds
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start
LIMIT 1;

-- name: status_outbox :many
-- Pending messages and the age of the oldest; dead messages.
-- guarantee: none
-- params: none
SELECT tenant_id, count(*) AS pending, extract(epoch FROM now() - min(created_at)) AS oldest,
       0::bigint AS dead
FROM agent_outbox WHERE state = 'pending' GROUP BY tenant_id
UNION ALL
SELECT tenant_id, 0, NULL, count(*) FROM agent_outbox WHERE state = 'dead' GROUP BY tenant_id;

-- name: status_processes :many
-- The agentdb workers and relays connected to this database now, found by
-- their sessions' application_name ('agentdb worker <id>', 'agentdb relay
-- <id>'), on this server: how many sessions each holds. Other roles' sessions show
-- only to a role with pg_read_all_stats (or a superuser).
-- guarantee: none
-- zero rows: no worker or relay is connected (that this role may see).
-- params: none
SELECT a.application_name, count(*) AS sessions,
       coalesce(host(inet_server_addr()), 'local') AS node_host,
       current_setting('port')::int4 AS node_port
FROM pg_stat_activity a
WHERE a.datname = current_database()
  AND (a.application_name LIKE 'agentdb worker %' OR a.application_name LIKE 'agentdb relay %')
GROUP BY a.application_name
ORDER BY a.application_name;

-- name: status_processes_citus :many
-- status_processes on a Citus cluster: the workers and relays connected to
-- any node of it - the coordinator or a worker node they were pointed at
-- (metadata is synced to every node) - each with the node it runs its
-- statements on. citus_stat_activity asks every node.
-- guarantee: none
-- zero rows: no worker or relay is connected (that this role may see).
-- params: none
SELECT a.application_name, count(*) AS sessions, n.nodename AS node_host,
       n.nodeport AS node_port
FROM citus_stat_activity a
JOIN pg_dist_node n ON n.nodeid = a.nodeid
WHERE a.datname = current_database() AND NOT a.is_worker_query
  AND (a.application_name LIKE 'agentdb worker %' OR a.application_name LIKE 'agentdb relay %')
GROUP BY a.application_name, n.nodename, n.nodeport
ORDER BY a.application_name, n.nodename, n.nodeport;

-- name: status_purge_backlog :one
-- What `agentdb purge` would remove now, per retention class (the events'
-- counts read agent_events_expiry_idx's range, as the purge does).
-- guarantee: none
-- zero rows: never (an aggregate without GROUP BY returns one row).
-- params: $1 outbox_delivered interval, $2 inbox interval
SELECT
    (SELECT count(*) FROM agent_events
     WHERE (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
       AND payload IS NOT NULL) AS event_payloads,
    (SELECT count(*) FROM agent_events
     WHERE (CASE WHEN payload IS NULL THEN retain_until ELSE payload_expires_at END) <= now()
       AND retain_until <= now()) AS events,
    (SELECT count(*) FROM agent_outbox WHERE state = 'delivered' AND delivered_at <= now() - $1::interval)
        AS outbox_delivered,
    (SELECT count(*) FROM agent_inbox WHERE processed_at <= now() - $2::interval) AS inbox;

-- name: status_tasks :many
-- Tasks per tenant and state.
-- guarantee: none
-- params: none
SELECT tenant_id, state, count(*) AS n FROM agent_tasks GROUP BY tenant_id, state;

-- name: status_tenants :many
-- Tenant names for the report.
-- guarantee: none
-- params: none
SELECT id, name, state FROM agent_tenants;

-- name: status_unsettled_operations :many
-- Operations not yet settled, by state ('unknown' needs reconciling).
-- guarantee: none
-- params: none
SELECT tenant_id, state, count(*) AS n
FROM agent_operations
WHERE state IN ('reserved', 'in_flight', 'unknown')
GROUP BY tenant_id, state;
