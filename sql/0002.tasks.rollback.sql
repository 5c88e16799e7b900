DROP TABLE agent_tasks;
