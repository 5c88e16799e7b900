-- Retention (G9): one short, resumable purge step at a time.

-- name: purge_step :one
-- Remove at most $2 rows of retention class $1 in one short statement (see
-- agentdb_purge in sql/0010.retention.sql); returns how many.
-- guarantee: G9
-- zero rows: never (a function call returns one row).
-- params: $1 kind text, $2 batch int4, $3 older_than interval
SELECT agentdb_purge($1, $2, $3) AS removed;
