-- 0008 notify: wake idle workers and relays when work arrives.
-- depends: 0007.access
-- phase: expand
--
-- A NOTIFY is only a hint: listeners also poll, so nothing depends on it
-- arriving (it does not behind a transaction-pooling proxy). Statement-level
-- triggers send one notification per statement, not per row, and Postgres
-- folds identical notifications within a transaction into one.

CREATE FUNCTION agentdb_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

-- A hint no guarantee rests on: a new outbox row wakes idle relays.
CREATE TRIGGER agent_outbox_notify
    AFTER INSERT ON agent_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_notify('agentdb_outbox');
-- A hint no guarantee rests on: a new task wakes idle workers.
CREATE TRIGGER agent_tasks_notify
    AFTER INSERT ON agent_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION agentdb_notify('agentdb_tasks');

CALL agentdb_pin_search_paths();
