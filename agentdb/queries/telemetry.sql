-- The pinned GenAI semantic-conventions version (G16).

-- name: semconv_latest :many
-- The latest GenAI semantic-conventions pin (no row: never pinned).
-- guarantee: G16
-- params: none
SELECT version, since FROM agent_semconv_pins ORDER BY since DESC LIMIT 1;

-- name: semconv_pin :many
-- Append a GenAI semantic-conventions pin unless it is already the latest.
-- One row: pinned now. No row: it already was.
-- guarantee: G16
-- params: $1 version text
INSERT INTO agent_semconv_pins (version)
SELECT $1
WHERE $1 IS DISTINCT FROM (SELECT version FROM agent_semconv_pins ORDER BY since DESC LIMIT 1)
RETURNING since;
