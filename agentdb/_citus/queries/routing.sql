-- Whether this schema is distributed by Citus (agentdb._citus.routing).

-- name: routing_distributed :one
-- Whether this schema's tables are distributed by Citus: the runtime then
-- runs its per-tenant, single-shard statement forms.
-- guarantee: none
-- zero rows: never (a function call returns one row); an unmigrated schema has no such function.
-- params: none
SELECT agentdb_distributed() AS distributed;
