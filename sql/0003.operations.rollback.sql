DROP TABLE agent_operations;
