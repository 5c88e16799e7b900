-- The MCP server kit (agentdb.integrations.mcp): is a tool call whose
-- operation is still reserved being run right now by a live server, or did
-- its server die between the call and its record (G13)? A server holds a
-- session advisory lock on the call's key for as long as it runs the tool
-- body; Postgres drops the lock with the connection of a server that died,
-- so the next attempt that takes it knows the first one is gone.

-- name: mcp_call_lock :one
-- Take the session advisory lock of call key $1 without waiting: held is
-- false while another live session (a server running that call) holds it.
-- guarantee: G13
-- zero rows: never: one row, true or false.
-- params: $1 key int8
SELECT pg_try_advisory_lock($1) AS held;

-- name: mcp_call_unlock :one
-- Give the session advisory lock of call key $1 back (the call is recorded).
-- guarantee: G13
-- zero rows: never: one row, false if this session did not hold it.
-- params: $1 key int8
SELECT pg_advisory_unlock($1) AS released;
