"""Mutants of the migrations in sql/: guards, CHECKs, grants, policies, the transition graph."""

from __future__ import annotations

from agentdb.tools.mutate.catalogue import ATTACKS, GUARD, Mutant, T, m

MUTANTS: tuple[Mutant, ...] = (
    m(
        "sql-cap-guard-silent",
        "sql/0012.fair_claim.sql",
        "        IF running > cap.max_running THEN\n",
        "        IF false THEN\n",
        (ATTACKS, T + "test_fairness.py"),
        "0012: agentdb_guard_concurrency lets a write pass a cap (AG009 never raised)",
    ),
    m(
        "sql-running-count-zero",
        "sql/0024.plpgsql_checks.sql",  # 0024 replaces agentdb_running_count (0012's is gone)
        "    WHERE t.tenant_id = p_tenant AND t.state = 'running'\n",
        "    WHERE false AND t.tenant_id = p_tenant AND t.state = 'running'\n",
        (ATTACKS, T + "test_fairness.py"),
        "0024: agentdb_running_count counts nothing, so no cap ever fills",
    ),
    # ---- migrations ---------------------------------------------------------------------------
    m(
        "sql-request-task-public",
        "sql/0007.access.sql",
        "REVOKE EXECUTE ON FUNCTION agentdb_request_task(text, text, jsonb, text, text, text, text) FROM PUBLIC;\n",
        "",
        (T + "test_access.py",),
        "0007: agentdb_request_task stays executable by PUBLIC",
    ),
    m(
        "sql-agent-writes-transitions",
        "sql/0007.access.sql",
        "        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_agent;",
        "        GRANT EXECUTE ON FUNCTION agentdb_current_tenant() TO agentdb_agent;\n"
        "        GRANT INSERT ON agent_transitions TO agentdb_agent;",
        (T + "test_access.py",),
        "0007: GRANT INSERT ON agent_transitions TO agentdb_agent",
    ),
    m(
        "sql-runtime-deletes-events",
        "sql/0007.access.sql",
        "        GRANT SELECT, INSERT ON agent_events, agent_inbox, agent_artifacts TO agentdb_runtime;",
        "        GRANT SELECT, INSERT, DELETE ON agent_events, agent_inbox, agent_artifacts TO agentdb_runtime;",
        (T + "test_access.py",),
        "0007: the runtime may DELETE audit events",
    ),
    m(
        "sql-agent-sees-every-task",
        # 0012's agentdb_grant_roles() recreates the agent policies (0007's are replaced).
        "sql/0012.fair_claim.sql",
        "FOR SELECT TO agentdb_agent USING (tenant_id = %s)',",
        "FOR SELECT TO agentdb_agent USING (true OR tenant_id = %s)',",
        (T + "test_access.py",),
        "0012: the agents' task, operation, event and artifact policies open every tenant",
    ),
    m(
        "sql-setting-beats-pin",
        "sql/0024.plpgsql_checks.sql",  # 0024 replaces agentdb_current_tenant (0001's is gone)
        "    RETURN coalesce(\n        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),\n        nullif(current_setting('agentdb.tenant_id', true), '')::uuid\n    );",
        "    RETURN coalesce(\n        nullif(current_setting('agentdb.tenant_id', true), '')::uuid,\n        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text)\n    );",
        (T + "test_access.py",),
        "0024: a session setting overrides a pinned login's tenant",
    ),
    m(
        "sql-current-tenant-back-to-sql",
        "sql/0024.plpgsql_checks.sql",
        "    LANGUAGE plpgsql STABLE SECURITY DEFINER\nAS $$\nBEGIN\n    RETURN coalesce(\n"
        "        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),\n"
        "        nullif(current_setting('agentdb.tenant_id', true), '')::uuid\n    );\nEND\n$$;",
        "    LANGUAGE sql STABLE SECURITY DEFINER\nAS $$\n    SELECT coalesce(\n"
        "        (SELECT p.tenant_id FROM agent_principals p WHERE p.role_name = session_user::text),\n"
        "        nullif(current_setting('agentdb.tenant_id', true), '')::uuid\n    )\n$$;",
        (T + "test_hot_functions.py",),
        "0024: agentdb_current_tenant stays SQL, planned again by every agent statement",
    ),
    m(
        "sql-edge-succeeded-pending",
        "sql/0001.foundation.sql",
        "    ('task', 'running',  'cancelled'),\n",
        "    ('task', 'running',  'cancelled'),\n    ('task', 'succeeded', 'pending'),\n",
        (ATTACKS,),
        "agent_transitions: add the edge task succeeded -> pending",
    ),
    m(
        "sql-transition-ignores-target",
        "sql/0001.foundation.sql",
        "        WHERE t.entity = TG_ARGV[0] AND t.from_state = prior AND t.to_state = NEW.state",
        "        WHERE t.entity = TG_ARGV[0] AND t.from_state = prior",
        (ATTACKS,),
        "agentdb_guard_transition: any move out of a state with an edge is allowed",
    ),
    m(
        "sql-append-only-rewrite",
        "sql/0004.events.sql",
        "    IF NEW.payload IS NULL AND probe IS NOT DISTINCT FROM OLD THEN",
        "    IF probe IS NOT DISTINCT FROM OLD THEN",
        (ATTACKS,),
        "agentdb_guard_append_only: drop `NEW.payload IS NULL AND` (any payload rewrite passes)",
    ),
    m(
        "sql-append-only-early-delete",
        "sql/0004.events.sql",
        "        IF OLD.retain_until <= now() THEN\n            RETURN OLD;",
        "        IF true THEN\n            RETURN OLD;",
        (ATTACKS,),
        "agentdb_guard_append_only: DELETE before retain_until passes",
    ),
    m(
        "sql-require-event-off",
        "sql/0004.events.sql",
        "    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN\n        RETURN NULL;",
        "    IF true THEN\n        RETURN NULL;",
        (ATTACKS,),
        "agentdb_require_event: a state change commits without its event",
    ),
    m(
        "sql-payload-cap",
        "sql/0004.events.sql",
        "octet_length(payload::text) <= 8192)",
        "octet_length(payload::text) <= 81920)",
        (ATTACKS,),
        "agent_events_payload_size: the cap grows tenfold",
    ),
    m(
        "sql-secret-key-password",
        "sql/0004.events.sql",
        "    SELECT k ~* '(passw|secret|",
        "    SELECT k ~* '(secret|",
        (ATTACKS, T + "test_redaction.py"),
        "agentdb_is_secret_key: forget password-like keys",
    ),
    # ---- 0028: events by month ---------------------------------------------------------------
    m(
        "sql-events-version-twice",
        "sql/0028.events_by_month.sql",
        "    ELSIF n > 1 THEN",
        "    ELSIF n > 2 THEN",
        (ATTACKS, T + "test_events_by_month.py", T + "test_events_diet.py"),
        "agentdb_event_records_once (0028): two events may record one state_version",
    ),
    m(
        "sql-require-event-by-month-off",
        "sql/0028.events_by_month.sql",
        "    IF TG_OP = 'UPDATE' AND NEW.state_version = OLD.state_version THEN\n        RETURN NULL;",
        "    IF true THEN\n        RETURN NULL;",
        (T + "test_events_by_month.py",),
        "agentdb_require_event_by_month (0028): a state change commits without its event",
    ),
    m(
        "sql-events-version-not-reached",
        "sql/0028.events_by_month.sql",
        "        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN\n"
        "            SELECT count(*) INTO n FROM (\n"
        "                SELECT FROM agent_events e\n"
        "                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id",
        "        IF NEW.created_at >= born - interval '1 day' THEN\n"
        "            SELECT count(*) INTO n FROM (\n"
        "                SELECT FROM agent_events e\n"
        "                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id",
        (T + "test_events_by_month.py",),
        "agentdb_event_records_once (0028): an event for a version the task never reached",
    ),
    m(
        "sql-events-older-than-task",
        "sql/0028.events_by_month.sql",
        "        IF reached >= recorded AND NEW.created_at >= born - interval '1 day' THEN\n"
        "            SELECT count(*) INTO n FROM (\n"
        "                SELECT FROM agent_events e\n"
        "                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id",
        "        IF reached >= recorded THEN\n"
        "            SELECT count(*) INTO n FROM (\n"
        "                SELECT FROM agent_events e\n"
        "                WHERE e.tenant_id = NEW.tenant_id AND e.task_id = NEW.task_id",
        (T + "test_events_by_month.py",),
        "agentdb_event_records_once (0028): a versioned event older than its task",
    ),
    m(
        "sql-months-drop-retained",
        "sql/0028.events_by_month.sql",
        "    holds_retained constant text := 'SELECT EXISTS (SELECT 1 FROM %s WHERE retain_until > now())';",
        "    holds_retained constant text := 'SELECT EXISTS (SELECT 1 FROM %s WHERE false)';",
        (T + "test_events_by_month.py",),
        "agentdb_event_partitions (0028): a month holding a retained row is dropped",
    ),
    m(
        "sql-months-drop-unfinished",
        "sql/0028.events_by_month.sql",
        "        CONTINUE WHEN upper_bound IS NULL OR upper_bound > now();",
        "        CONTINUE WHEN upper_bound IS NULL;",
        (T + "test_events_by_month.py",),
        "agentdb_event_partitions (0028): a month that is not over is dropped",
    ),
    m(
        "sql-months-no-truncate-guard",
        "sql/0028.events_by_month.sql",
        "            EXECUTE format('CREATE TRIGGER agent_events_no_truncate BEFORE TRUNCATE ON %I.%I '",
        "            EXECUTE format('SELECT %L, %L',",
        (T + "test_events_by_month.py",),
        "agentdb_event_partitions (0028): a month created later may be truncated",
    ),
    m(
        "sql-legacy-keeps-grants",
        "sql/0028.events_by_month.sql",
        "            EXECUTE format('REVOKE ALL ON %s%s FROM %s', g.kind, p_from, g.who);",
        "            NULL;",
        (T + "test_access.py", T + "test_events_by_month.py"),
        "0028: the old table keeps its grants as a partition (RLS bypassed by name)",
    ),
    m(
        "sql-purge-events-by-id",
        "sql/0028.events_by_month.sql",
        "        USING (SELECT tenant_id, id, created_at FROM agent_events WHERE retain_until <= now()\n"
        "               LIMIT p_batch FOR UPDATE SKIP LOCKED) v\n"
        "        WHERE e.tenant_id = v.tenant_id AND e.id = v.id AND e.created_at = v.created_at;",
        "        USING (SELECT tenant_id, id, created_at FROM agent_events WHERE retain_until <= now()\n"
        "               LIMIT p_batch FOR UPDATE SKIP LOCKED) v\n"
        "        WHERE e.tenant_id = v.tenant_id AND e.id = v.id;",
        (T + "test_events_by_month.py", T + "test_retention.py"),
        "agentdb_purge (0028): events deleted by (tenant_id, id), a copied id taken along",
    ),
    m(
        "sql-check-prefilter-pem",
        "sql/0025.events_diet.sql",
        "    CHECK (payload::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|",
        "    CHECK (payload::text !~* '(passw|secret|api[_-]?key|authori[sz]ation|bearer|private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|",
        (ATTACKS, T + "test_events_diet.py"),
        "agent_events_payload_no_secrets (0025): the inline prefilter forgets PEM keys",
    ),
    m(
        "sql-check-skips-the-function",
        "sql/0025.events_diet.sql",
        "           OR NOT agentdb_jsonb_has_secrets(payload))",
        "           OR true)",
        (ATTACKS,),
        "agent_events_payload_no_secrets (0025): a payload the prefilter matches is never walked",
    ),
    m(
        "sql-secret-prefilter-pem",
        "sql/0024.plpgsql_checks.sql",  # 0024 replaces agentdb_jsonb_has_secrets (0016's is gone)
        "(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|",
        "(access|refresh|id|auth|session)[_-]?token|cookie|",
        (ATTACKS, T + "test_redaction.py"),
        "agentdb_jsonb_has_secrets: the prefilter misses PEM private keys",
    ),
    m(
        "sql-secret-prefilter-token",
        "sql/0024.plpgsql_checks.sql",
        "private[_-]?key|(access|refresh|id|auth|session)[_-]?token|cookie|-----BEGIN|",
        "private[_-]?key|(access|refresh|session)[_-]?token|cookie|-----BEGIN|",
        (ATTACKS, T + "test_redaction.py"),
        "agentdb_jsonb_has_secrets: the prefilter misses id_token and auth_token keys",
    ),
    m(
        "sql-guard-no-input-hash",
        GUARD,
        "    IF NEW.input_hash IS DISTINCT FROM OLD.input_hash THEN\n        RAISE EXCEPTION 'agentdb: the input_hash of a % row is bound to its key', TG_TABLE_NAME\n            USING ERRCODE = 'AG008', CONSTRAINT = TG_NAME, TABLE = TG_TABLE_NAME;\n    END IF;\n",
        "",
        (ATTACKS,),
        "agentdb_guard_version: drop the input_hash immutability check",
    ),
    m(
        "sql-guard-no-action",
        GUARD,
        "           OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key\n           OR NEW.action IS DISTINCT FROM OLD.action THEN",
        "           OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key THEN",
        (ATTACKS,),
        "agentdb_guard_version: drop the action immutability check",
    ),
    m(
        "sql-guard-no-dedupe-key",
        GUARD,
        "        IF NEW.task_type IS DISTINCT FROM OLD.task_type\n           OR NEW.dedupe_key IS DISTINCT FROM OLD.dedupe_key THEN",
        "        IF NEW.task_type IS DISTINCT FROM OLD.task_type THEN",
        (ATTACKS,),
        "agentdb_guard_version: drop the dedupe_key immutability check",
    ),
    m(
        "sql-guard-no-task-id",
        GUARD,
        "        IF NEW.task_id IS DISTINCT FROM OLD.task_id\n           OR NEW.idempotency_key",
        "        IF NEW.idempotency_key",
        (ATTACKS,),
        "agentdb_guard_version: an operation may move to another task",
    ),
    m(
        "sql-guard-no-created-at",
        GUARD,
        "    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id\n       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN",
        "    IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id OR NEW.id IS DISTINCT FROM OLD.id THEN",
        (ATTACKS,),
        "agentdb_guard_version: created_at may change",
    ),
    m(
        "sql-guard-token-backwards",
        GUARD,
        "        IF NEW.lease_token < OLD.lease_token\n           OR (NEW.lease_owner IS NOT NULL",
        "        IF (NEW.lease_owner IS NOT NULL",
        (ATTACKS,),
        "agentdb_guard_version: a lease token may go backwards",
    ),
    m(
        "sql-guard-regrant-same-token",
        GUARD,
        "               AND NEW.lease_token <= OLD.lease_token) THEN",
        "               AND NEW.lease_token < OLD.lease_token) THEN",
        (ATTACKS,),
        "agentdb_guard_version: a new grant may reuse the old token",
    ),
    m(
        "sql-guard-version-skip",
        GUARD,
        "    IF NEW.state_version = OLD.state_version + 1 THEN\n        RETURN NEW;",
        "    IF NEW.state_version > OLD.state_version THEN\n        RETURN NEW;",
        (ATTACKS,),
        "agentdb_guard_version: a write may skip versions",
    ),
    m(
        "sql-guard-heartbeat-smuggle",
        GUARD,
        "        IF probe IS NOT DISTINCT FROM OLD THEN\n            RETURN NEW;\n        END IF;\n    END IF;\n    RAISE EXCEPTION 'agentdb: % state_version",
        "        RETURN NEW;\n    END IF;\n    RAISE EXCEPTION 'agentdb: % state_version",
        (ATTACKS,),
        "agentdb_guard_version: any write at the same version passes (not only a heartbeat)",
    ),
    m(
        "sql-running-is-leased-one-way",
        "sql/0002.tasks.sql",
        "    CONSTRAINT agent_tasks_running_is_leased CHECK ((state = 'running') = (lease_owner IS NOT NULL)),",
        "    CONSTRAINT agent_tasks_running_is_leased CHECK (state <> 'running' OR lease_owner IS NOT NULL),",
        (ATTACKS,),
        "agent_tasks_running_is_leased: a finished task may keep a lease",
    ),
    m(
        "sql-lease-complete-owner-only",
        "sql/0002.tasks.sql",
        "        (lease_owner IS NULL) = (lease_acquired_at IS NULL)\n        AND (lease_owner IS NULL) = (lease_expires_at IS NULL)),",
        "        (lease_owner IS NULL) = (lease_acquired_at IS NULL)),",
        (ATTACKS,),
        "agent_tasks_lease_complete: a lease without an expiry",
    ),
    m(
        "sql-succeeded-with-error",
        "sql/0003.operations.sql",
        "    CONSTRAINT agent_operations_succeeded_has_no_error CHECK (state <> 'succeeded' OR error IS NULL),",
        "    CONSTRAINT agent_operations_succeeded_has_no_error CHECK (true),",
        (ATTACKS,),
        "agent_operations_succeeded_has_no_error: a succeeded operation keeps an error",
    ),
    m(
        "sql-delivered-without-time",
        "sql/0005.outbox.sql",
        "    CONSTRAINT agent_outbox_delivered_at_valid CHECK ((state = 'delivered') = (delivered_at IS NOT NULL)),",
        "    CONSTRAINT agent_outbox_delivered_at_valid CHECK (state <> 'delivered' OR delivered_at IS NOT NULL),",
        (ATTACKS,),
        "agent_outbox_delivered_at_valid: a pending message may carry delivered_at",
    ),
    m(
        "sql-credential-secret-in-uri",
        "sql/0006.artifacts.sql",
        "        AND secret_ref ~ '^[a-z][a-z0-9+.-]*://[^[:space:]]+$'\n        AND NOT agentdb_is_secret_value(secret_ref))",
        "        AND secret_ref ~ '^[a-z][a-z0-9+.-]*://[^[:space:]]+$')",
        (ATTACKS,),
        "agent_credential_refs_is_reference: a secret inside the reference passes",
    ),
    m(
        "sql-tenant-delete-keeps-credentials",
        "sql/0012.fair_claim.sql",  # 0012 replaces agentdb_delete_tenant (0009's is gone)
        "        DELETE FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;",
        "        PERFORM 1 FROM agent_credential_refs c WHERE c.tenant_id = p_tenant;",
        (T + "test_tenant_deletion.py",),
        "agentdb_delete_tenant: credential references survive the deletion",
    ),
    m(
        "sql-tenant-fk-cascade",
        "sql/0002.tasks.sql",
        "    CONSTRAINT agent_tasks_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id),",
        "    CONSTRAINT agent_tasks_tenant_fkey FOREIGN KEY (tenant_id) REFERENCES agent_tenants (id) ON DELETE CASCADE,",
        (
            T + "test_tenant_deletion.py",
            T + "test_audit.py::test_fresh_agentdb_schema_enforces_every_guarantee",
        ),
        "agent_tasks_tenant_fkey: deleting a tenant cascades silently",
    ),
)
