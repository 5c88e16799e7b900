DROP TABLE agent_credential_refs;
DROP TABLE agent_artifacts;
