-- Back to 0002: no operations, artifacts or credential references.
DROP TABLE agent_credential_refs;
DROP TABLE agent_artifacts;
DROP TABLE agent_operations;
