DROP FUNCTION agentdb_delete_tenant(uuid, boolean, text);
