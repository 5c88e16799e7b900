-- 0018 room to update: tasks and operations leave a fifth of each page free
-- for the versions their updates write (issue 41).
-- depends: 0017.wake_after_commit
-- phase: expand
--
-- * A task is written three times (made, claimed, finished) and an operation
--   three (reserved, in flight, settled), and no such update is HOT: each
--   moves the state, which the claim and retention indexes' predicates read.
--   A non-HOT update still puts its new version on the old one's page when
--   the page has room. At the default fillfactor (100) the insertions fill
--   every page, so the new version went to another page, and after each
--   checkpoint the first change to each such page wrote the whole page to
--   the WAL. With 20,000 units of history, a CHECKPOINT, then 1,000 units
--   measured (`agentdb bench --history 20000`, two runs each on one server),
--   agent_tasks' full-page images per unit went from 4,586 and 4,556 bytes
--   to 1,856 and 492 (docs/benchmarks.md).
-- * fillfactor 80: the tables take about a quarter more pages for the same
--   rows; finished rows leave them by retention (agentdb purge). Pages
--   written before this migration keep what they hold until rewritten.
-- * On Citus the storage parameter reaches every shard (ALTER TABLE on a
--   distributed table is propagated).

ALTER TABLE agent_tasks SET (fillfactor = 80);
ALTER TABLE agent_operations SET (fillfactor = 80);

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0018.room_to_update'::text $$;

CALL agentdb_pin_search_paths();
