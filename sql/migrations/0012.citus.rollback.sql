-- Back to 0011: the routines go; a schema already distributed stays so
-- (Citus has undistribute_table for that, table by table).
DROP FUNCTION agentdb_schema_version();
DROP PROCEDURE agentdb_distribute(integer);
