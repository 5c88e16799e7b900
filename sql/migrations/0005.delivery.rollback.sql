-- Back to 0004: no outbox, no inbox.
DROP TABLE agent_inbox;
DROP TABLE agent_outbox;
