-- 0017 wake after commit: a create the runtime commits by itself sends no
-- NOTIFY from inside its transaction; the runtime wakes listeners once it has
-- committed (issue 41).
-- depends: 0016.partial_keys
-- phase: expand
--
-- * Why: PostgreSQL serialises the commits of every transaction that has
--   sent a NOTIFY, cluster-wide. PreCommit_Notify (async.c) takes one lock
--   before the commit record is written and holds it until the record is
--   flushed, so that notifications enter the queue in commit order. Such
--   transactions get no group commit: on a server with fsync=on, concurrent
--   creates ran at most one per WAL flush, and every worker's finish behind
--   them waited in the same line. Measured in `agentdb bench` against DBOS
--   (docs/benchmarks.md): the creates were what capped agentdb's units/s.
-- * agentdb_notify() redefined whole (0001.foundation's, with one test): a
--   transaction that set agentdb.wake to 'after_commit' (SET LOCAL, or
--   set_config(..., true)) sends nothing; its writer promises to wake the
--   listeners itself after the commit. The runtime's task_create does so
--   when it is its own transaction (a pool, or a connection outside any
--   transaction: agentdb/_db/wake.py), one NOTIFY for a burst of creates.
--   Every other write - raw SQL, a create inside the caller's transaction,
--   the worker's batches - notifies at commit as before.
-- * Still a hint no guarantee rests on: listeners poll too.

-- A hint no guarantee rests on: wake idle workers and relays when work
-- arrives. Listeners also poll, so nothing depends on it arriving (it does
-- not behind a transaction-pooling proxy). Its triggers are statement-level:
-- one notification per statement, not per row, and Postgres folds identical
-- notifications within a transaction into one. A transaction that set
-- agentdb.wake = 'after_commit' sends none: its writer wakes the listeners
-- after its commit (a NOTIFY serialises commits cluster-wide; see 0017's
-- header).
CREATE OR REPLACE FUNCTION agentdb_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('agentdb.wake', true) IS DISTINCT FROM 'after_commit' THEN
        PERFORM pg_notify(TG_ARGV[0], '');
    END IF;
    RETURN NULL;
END
$$;

-- The newest migration names itself.
CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0017.wake_after_commit'::text $$;

CALL agentdb_pin_search_paths();
