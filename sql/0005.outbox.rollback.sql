DROP TABLE agent_inbox;
DROP TABLE agent_outbox;
