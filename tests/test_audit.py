"""``agentdb audit`` against real schemas: agentdb's own, the article's, and broken ones.

Each broken schema is agentdb's migrated schema with one thing taken away (or
a small foreign schema in an empty database). A test asserts that exactly the
guarantees it names change status and that every other guarantee keeps the
status it has on the unbroken baseline - a check that fires on the wrong
guarantee is as wrong as one that does not fire.

The audits run as ``agentdb_test_auditor``, a login with no privileges at
all: the catalog is world-readable, and the audit must need nothing more.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from psycopg import sql

from agentdb import tasks
from agentdb.errors import ConfigurationError, DatabaseUnavailable
from agentdb.guarantees import GUARANTEES
from agentdb.tools.audit import api as audit
from agentdb.tools.audit import catalog
from tests import _pg
from tests import factories as F
from tests.conftest import _ROLE_LOCK, Database, Tenants

ROOT = Path(__file__).resolve().parent.parent
AUDITOR = "agentdb_test_auditor"
ALL = list(GUARANTEES)

# The article's two CREATE TABLE statements, verbatim, and an events table
# with exactly the columns its INSERT INTO agent_events names.
ARTICLE_SQL = """
CREATE TABLE agent_tasks (
  id uuid PRIMARY KEY,
  tenant_id uuid NOT NULL,
  workflow_version text NOT NULL,
  state text NOT NULL,
  state_version bigint NOT NULL DEFAULT 0,
  current_step text,
  wake_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (tenant_id, id)
);

CREATE TABLE agent_operations (
  id uuid PRIMARY KEY,
  tenant_id uuid NOT NULL,
  task_id uuid NOT NULL,
  idempotency_key text NOT NULL,
  action text NOT NULL,
  input_hash text NOT NULL,
  state text NOT NULL,
  provider_reference text,
  result jsonb,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (tenant_id, idempotency_key),
  FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id)
);

CREATE TABLE agent_events (
  tenant_id uuid, task_id uuid, event_type text, actor_id text, policy_version text,
  payload jsonb
);
"""

# What the article's schema enforces, by its own DDL.
ARTICLE_STATUSES = {
    "G1": "enforced",  # separate tables, composite FK, wake_at
    "G2": "partial",  # the composite FK is there; PKs without tenant_id, events unlinked
    "G3": "enforced",  # UNIQUE (tenant_id, idempotency_key)
    "G4": "partial",  # input_hash NOT NULL, but any text passes as a hash
    "G5": "missing",  # state is free text
    "G6": "missing",  # no transition guard
    "G7": "partial",  # a version column on tasks, nothing moving it
    "G8": "missing",  # no append-only protection, no event link
    "G9": "missing",  # unbounded payloads, no retention
    "G10": "missing",  # no outbox
    "G11": "not_applicable",  # nothing relayed
    "G12": "missing",  # no lease columns
    "G13": "missing",  # no 'unknown' state, no index
    "G14": "enforced",  # no JSON path in an index, policy or CHECK
    "G15": "missing",  # no RLS
    "G16": "missing",  # no trace/span ids
    "G17": "missing",  # no tenants table: nothing anchors a tenant's rows
    "G18": "missing",  # no tenant-leading due index, no caps
    "G19": "missing",  # no budget table, no rate limits
    "G20": "missing",  # no trigger on agent_operations reads agent_tasks
    "G21": "not_applicable",  # no deadline column
    "G22": "not_applicable",  # no signal table
    "G23": "not_applicable",  # no parent reference
    "G24": "not_applicable",  # no schedule table
    "G25": "not_applicable",  # no step table
}


@pytest.fixture(scope="session")
def auditor(pg_server: _pg.Server) -> str:
    """A login with no grants, no membership, no attributes (roles are cluster-wide)."""
    with _pg.admin(pg_server.admin_dsn) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
        try:
            _pg.ensure_role(conn, AUDITOR)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_ROLE_LOCK,))
    return AUDITOR


def _as_auditor(server: _pg.Server, dbname: str) -> str:
    return server.url(dbname, user=AUDITOR, password=_pg.TEST_PASSWORD)


@pytest.fixture
def agentdb_dsn(db: Database, auditor: str) -> str:
    return db.url(auditor)


@pytest.fixture
def empty_db(pg_server: _pg.Server, auditor: str) -> Iterator[str]:
    """An empty database (its name); apply a DDL script with :func:`_apply`."""
    with _pg.temp_database(pg_server) as name:
        yield name


@pytest.fixture
def article_dsn(pg_server: _pg.Server, empty_db: str) -> str:
    _apply(pg_server.url(empty_db), ARTICLE_SQL)
    return _as_auditor(pg_server, empty_db)


def _apply(admin_dsn: str, ddl: str) -> None:
    with _pg.admin(admin_dsn) as conn:
        conn.execute(ddl.encode())  # a static multi-statement script from this file


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "agentdb", "audit", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def _one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("agentdb: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr, result.stderr


def _broken(db: Database, ddl: str, **expected: str) -> audit.Report:
    """Break the migrated schema with ``ddl``; assert exactly ``expected`` changed.

    Every guarantee not in ``expected`` must keep its baseline status.
    """
    before = audit.audit(db.url(AUDITOR)).statuses()
    assert set(before.values()) == {"enforced"}, before
    _apply(db.admin_dsn, ddl)
    report = audit.audit(db.url(AUDITOR))
    changed = {g: s for g, s in report.statuses().items() if s != before[g]}
    assert changed == expected, report.render()
    return report


def _problems(report: audit.Report, gid: str) -> str:
    return "\n".join(report.finding(gid).problems)


# --- agentdb's own schema ----------------------------------------------------------


def test_fresh_agentdb_schema_enforces_every_guarantee(agentdb_dsn: str) -> None:
    report = audit.audit(agentdb_dsn)
    assert report.statuses() == dict.fromkeys(ALL, "enforced"), report.render()
    assert [f.guarantee for f in report.findings] == ALL
    for f in report.findings:
        assert f.evidence, f.guarantee  # enforced always names what enforces it
        assert f.problems == ()
        assert f.fix is None
    assert {k: r.name if r else None for k, r in report.tables.items()} == {
        "tasks": "agent_tasks",
        "operations": "agent_operations",
        "events": "agent_events",
        "outbox": "agent_outbox",
        "inbox": "agent_inbox",
        "tenants": "agent_tenants",
        "credentials": "agent_credential_refs",
    }


def test_fresh_agentdb_schema_cli_exits_0_with_fail_on_partial(agentdb_dsn: str) -> None:
    result = _cli("--dsn", agentdb_dsn, "--fail-on", "partial")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "25 guarantees: 25 enforced, 0 partial, 0 missing" in result.stdout


def test_G13_evidence_is_the_unknown_state_and_the_unsettled_index(agentdb_dsn: str) -> None:
    evidence = audit.audit(agentdb_dsn).finding("G13").evidence
    assert "check agent_operations_state_valid (has 'unknown')" in evidence
    assert "index agent_operations_unsettled_idx" in evidence


def test_G17_evidence_is_restrict_fks_and_the_reference_check(agentdb_dsn: str) -> None:
    f = audit.audit(agentdb_dsn).finding("G17")
    assert "check agent_credential_refs_is_reference" in f.evidence
    assert "fk agent_operations_task_fkey" in f.evidence
    assert "table agent_tenants" in f.evidence


def test_G15_superuser_connection_is_flagged(db: Database, auditor: str) -> None:
    baseline = audit.audit(db.url(auditor)).statuses()
    report = audit.audit(db.admin_dsn)
    changed = {g: s for g, s in report.statuses().items() if s != baseline[g]}
    assert changed == {"G15": "partial"}
    assert f"connected as {report.role}, which is a superuser" in _problems(report, "G15")


def test_G15_bypassrls_member_of_a_policy_role_is_flagged(
    db: Database, pg_server: _pg.Server, auditor: str
) -> None:
    # Roles are cluster-wide: unique names, and dropped again, so no other
    # database's audit ever sees them.
    suffix = uuid.uuid4().hex[:8]
    group, member = f"agentdb_test_grp_{suffix}", f"agentdb_test_bypass_{suffix}"
    with _pg.admin(pg_server.admin_dsn) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(group)))
        conn.execute(
            sql.SQL("CREATE ROLE {} NOLOGIN BYPASSRLS IN ROLE {}").format(
                sql.Identifier(member), sql.Identifier(group)
            )
        )
    try:
        report = _broken(
            db,
            f"CREATE POLICY agent_tasks_reporting ON agent_tasks FOR SELECT TO {group} "
            "USING (tenant_id IS NOT NULL)",
            G15="partial",
        )
        assert f"role {member} is BYPASSRLS and inherits {group}" in _problems(report, "G15")
    finally:
        with _pg.admin(db.admin_dsn) as conn:
            conn.execute("DROP POLICY IF EXISTS agent_tasks_reporting ON agent_tasks")
        with _pg.admin(pg_server.admin_dsn) as conn:
            for role in (member, group):
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# --- the article's schema -----------------------------------------------------------


def test_article_schema_names_what_is_missing_or_partial(article_dsn: str) -> None:
    report = audit.audit(article_dsn)
    assert report.statuses() == ARTICLE_STATUSES, report.render()
    reasons = {f.guarantee: f.reason for f in report.findings}
    assert "no trigger guards agent_tasks.state" in reasons["G6"]
    assert "agent_events is not append-only" in reasons["G8"]
    assert "no outbox table" in reasons["G10"]
    assert "row-level security is off" in reasons["G15"]
    assert "agent_tasks_pkey is PRIMARY KEY (id)" in _problems(report, "G2")
    assert "agent_events.task_id has no foreign key" in _problems(report, "G2")
    for f in report.findings:
        if f.status in ("partial", "missing"):
            assert f.fix, f.guarantee  # every gap comes with a suggested fix
            assert "\n" not in f.reason


def test_article_schema_fails_ci_with_fail_on_missing(article_dsn: str) -> None:
    result = _cli("--dsn", article_dsn, "--fail-on", "missing")
    _one_line(result, audit.EXIT_FINDINGS, "--fail-on missing")
    assert "G8   missing" in result.stdout
    # Without --fail-on it is a report, not a verdict.
    assert _cli("--dsn", article_dsn).returncode == 0


def test_the_audit_page_s_example_is_the_article_schema_output(article_dsn: str) -> None:
    section = (ROOT / "docs" / "audit.md").read_text()
    example = re.search(r"```text\n(agentdb audit: .*?)```", section, flags=re.S)
    assert example is not None
    rendered = audit.audit(article_dsn).render()
    # The first line names the database, role and server version of this run.
    assert example.group(1).splitlines()[1:] == rendered.splitlines()[1:]


# --- broken schemas: each flagged on its guarantee, nothing else moves ---------------


def test_G2_fk_on_task_id_alone_is_flagged(db: Database, auditor: str) -> None:
    # The article's shape (PRIMARY KEY (id) plus UNIQUE (tenant_id, id)) with the
    # operation's foreign key on task_id alone.
    report = _broken(
        db,
        """
        ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_pkey CASCADE;
        ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_pkey PRIMARY KEY (id);
        ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_tenant_id_key UNIQUE (tenant_id, id);
        ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_outbox ADD CONSTRAINT agent_outbox_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_artifacts ADD CONSTRAINT agent_artifacts_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_operations ADD CONSTRAINT agent_operations_task_fkey
            FOREIGN KEY (task_id) REFERENCES agent_tasks (id);
        ALTER TABLE agent_signals ADD CONSTRAINT agent_signals_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_budgets ADD CONSTRAINT agent_budgets_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_parent_fkey
            FOREIGN KEY (tenant_id, parent_id) REFERENCES agent_tasks (tenant_id, id);
        ALTER TABLE agent_steps ADD CONSTRAINT agent_steps_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id);
        """,
        G2="partial",
    )
    problems = _problems(report, "G2")
    assert "agent_operations_task_fkey (task_id) -> agent_tasks (id)" in problems
    assert "another tenant's row" in problems


def test_G3_unique_idempotency_key_without_tenant_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        """
        ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_idempotency_key;
        ALTER TABLE agent_operations ADD CONSTRAINT agent_operations_key_global
            UNIQUE (idempotency_key);
        """,
        G3="partial",
    )
    assert "agent_operations_key_global (idempotency_key)" in _problems(report, "G3")
    assert "spans tenants" in report.finding("G3").reason


def test_G3_unique_key_without_tenant_on_another_table_is_flagged(
    db: Database, auditor: str
) -> None:
    report = _broken(
        db, "CREATE UNIQUE INDEX agent_artifacts_uri_key ON agent_artifacts (uri)", G3="partial"
    )
    assert (
        "agent_artifacts_uri_key (uri) on agent_artifacts spans tenants"
        in report.finding("G3").reason
    )


def test_G3_idempotency_key_not_unique_at_all_is_missing(db: Database, auditor: str) -> None:
    _broken(
        db,
        "ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_idempotency_key",
        G3="missing",
    )


def test_G4_input_hash_without_format_check_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_input_hash_format",
        G4="partial",
    )
    assert "CHECK (input_hash ~ '^[0-9a-f]{64}$')" in (report.finding("G4").fix or "")


def test_G5_state_without_check_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db, "ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_state_valid", G5="partial"
    )
    assert report.finding("G5").reason.startswith("agent_tasks.state accepts any value")


def test_G5_a_value_list_on_one_side_of_an_or_bounds_nothing(db: Database, auditor: str) -> None:
    """`state IN (...) OR attempts >= 0` lets `state = 'bogus'` through on any row."""
    report = _broken(
        db,
        r"""
        DO $$
        DECLARE d text;
        BEGIN
            SELECT pg_get_constraintdef(oid) INTO d FROM pg_constraint
            WHERE conname = 'agent_tasks_state_valid';
            ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_state_valid;
            EXECUTE 'ALTER TABLE agent_tasks ADD CONSTRAINT agent_tasks_state_valid '
                || regexp_replace(d, '^CHECK \((.*)\)$', 'CHECK ((\1) OR attempts >= 0)');
        END $$;
        """,
        G5="partial",
    )
    assert report.finding("G5").reason.startswith("agent_tasks.state accepts any value")


@pytest.mark.parametrize(
    ("check", "g5"),
    [("length(VALUE) < 40", "missing"), ("VALUE IN ('queued', 'done')", "enforced")],
    ids=["length", "list"],
)
def test_G5_a_domain_is_a_value_set_only_if_it_lists_or_patterns_the_values(
    check: str, g5: str, pg_server: _pg.Server, empty_db: str
) -> None:
    _apply(
        pg_server.url(empty_db),
        f"""
        CREATE DOMAIN job_state AS text CHECK ({check});
        CREATE TABLE jobs (tenant_id uuid NOT NULL, id uuid NOT NULL, state job_state NOT NULL,
                           PRIMARY KEY (tenant_id, id));
        """,
    )
    report = audit.audit(_as_auditor(pg_server, empty_db))
    assert report.finding("G5").status == g5, report.render()


def test_G3_a_unique_index_partial_on_another_column_is_partial(db: Database, auditor: str) -> None:
    """WHERE result IS NOT NULL: every key without a result may repeat."""
    report = _broken(
        db,
        """
        ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_idempotency_key;
        CREATE UNIQUE INDEX agent_operations_key_with_result
            ON agent_operations (tenant_id, idempotency_key) WHERE result IS NOT NULL;
        """,
        G3="partial",
    )
    assert "unique only while a row matches the index predicate" in report.finding("G3").reason


@pytest.mark.parametrize(
    "guard",
    [
        # Fires only past the 5th nested trigger level: every direct UPDATE passes.
        """DROP TRIGGER agent_tasks_transition_guard ON agent_tasks;
           CREATE TRIGGER agent_tasks_transition_guard BEFORE INSERT OR UPDATE OF state
               ON agent_tasks FOR EACH ROW WHEN (pg_trigger_depth() > 5)
               EXECUTE FUNCTION agentdb_guard_transition('task');""",
        # Its only RAISE is in a comment.
        """DROP TRIGGER agent_operations_transition_guard ON agent_operations;
           CREATE FUNCTION op_guard_todo() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               -- TODO: RAISE EXCEPTION when OLD.state is final
               RETURN NEW;
           END $$;
           CREATE TRIGGER agent_operations_transition_guard BEFORE UPDATE OF state
               ON agent_operations FOR EACH ROW EXECUTE FUNCTION op_guard_todo();""",
    ],
    ids=["when-clause", "raise-in-a-comment"],
)
def test_G6_a_guard_that_can_skip_a_move_does_not_count(
    guard: str, db: Database, auditor: str
) -> None:
    _broken(db, guard, G6="partial")


def test_G6_operations_without_transition_guard_are_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "DROP TRIGGER agent_operations_transition_guard ON agent_operations",
        G6="partial",
    )
    assert "no trigger guards agent_operations.state" in report.finding("G6").reason


def test_G6_a_disabled_guard_does_not_count(db: Database, auditor: str) -> None:
    _broken(
        db, "ALTER TABLE agent_tasks DISABLE TRIGGER agent_tasks_transition_guard", G6="partial"
    )


def test_G7_G12_tasks_without_version_guard_are_flagged(db: Database, auditor: str) -> None:
    # agent_tasks_version_guard enforces both the +1 version rule and the
    # growing lease token: without it, both guarantees lose their trigger.
    report = _broken(
        db, "DROP TRIGGER agent_tasks_version_guard ON agent_tasks", G7="partial", G12="partial"
    )
    assert "agent_tasks.state_version" in report.finding("G7").reason
    assert "agent_tasks.lease_token" in report.finding("G12").reason


def test_G8_events_without_protection_are_flagged(db: Database, auditor: str) -> None:
    # The state-change triggers still write every event: half of G8 holds.
    report = _broken(
        db,
        """
        DROP TRIGGER agent_events_append_only ON agent_events;
        DROP TRIGGER agent_events_no_truncate ON agent_events;
        GRANT UPDATE, DELETE, TRUNCATE ON agent_events TO agentdb_runtime;
        """,
        G8="partial",
    )
    reason = report.finding("G8").reason
    assert "agent_events is not append-only: UPDATE, DELETE and TRUNCATE" in reason
    assert "granted to agentdb_runtime" in reason
    assert "REVOKE UPDATE, DELETE, TRUNCATE ON agent_events FROM agentdb_runtime" in (
        report.finding("G8").fix or ""
    )


@pytest.mark.parametrize(
    "protection",
    [
        # Refuses an UPDATE of the payload only: the event type can be forged.
        """CREATE TRIGGER agent_events_append_only BEFORE UPDATE OF payload OR DELETE
               ON agent_events FOR EACH ROW EXECUTE FUNCTION agentdb_guard_append_only();""",
        # Refuses every change but only past the 5th nested trigger level.
        """CREATE TRIGGER agent_events_append_only BEFORE UPDATE OR DELETE ON agent_events
               FOR EACH ROW WHEN (pg_trigger_depth() > 5)
               EXECUTE FUNCTION agentdb_guard_append_only();""",
        # Rules that rewrite some events only.
        """CREATE RULE events_no_update AS ON UPDATE TO agent_events
               WHERE old.event_type = 'task.succeeded' DO INSTEAD NOTHING;
           CREATE RULE events_no_delete AS ON DELETE TO agent_events
               WHERE old.event_type = 'task.succeeded' DO INSTEAD NOTHING;""",
    ],
    ids=["update-of-one-column", "when-clause", "rules-with-where"],
)
def test_G8_protection_of_some_rows_or_columns_is_not_append_only(
    protection: str, db: Database, auditor: str
) -> None:
    report = _broken(
        db,
        f"""
        DROP TRIGGER agent_events_append_only ON agent_events;
        GRANT UPDATE, DELETE ON agent_events TO agentdb_runtime;
        {protection}
        """,
        G8="partial",
    )
    assert "agent_events is not append-only" in report.finding("G8").reason


def test_G8_withheld_privileges_count_as_append_only(db: Database, auditor: str) -> None:
    # Without the triggers, the grants still keep the runtime to INSERT.
    report = _broken(
        db,
        """
        DROP TRIGGER agent_events_append_only ON agent_events;
        DROP TRIGGER agent_events_no_truncate ON agent_events;
        """,
    )
    assert any(
        e.startswith("privileges: ") and "agentdb_runtime" in e and " may INSERT" in e
        for e in report.finding("G8").evidence
    )


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        # Without the triggers only privileges keep events append-only (the test above);
        # an UPDATE granted on one column is enough to forge an event.
        ("""DROP TRIGGER agent_events_append_only ON agent_events;
            DROP TRIGGER agent_events_no_truncate ON agent_events;
            GRANT UPDATE (event_type) ON agent_events TO agentdb_runtime;""", {"G8": "partial"}),
        ("GRANT UPDATE (state) ON agent_tasks TO PUBLIC;", {"G15": "partial"}),
    ],
    ids=["G8-update-of-a-column", "G15-public-update-of-a-column"],
)  # fmt: skip
def test_a_privilege_granted_on_a_column_counts_as_on_the_table(
    ddl: str, expected: dict[str, str], db: Database, auditor: str
) -> None:
    _broken(db, ddl, **expected)


def test_G8_state_change_without_its_event_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(db, "DROP TRIGGER agent_tasks_event_required ON agent_tasks", G8="partial")
    assert "nothing ties a state change of agent_tasks" in report.finding("G8").reason


def test_G9_payload_without_size_cap_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db, "ALTER TABLE agent_events DROP CONSTRAINT agent_events_payload_size", G9="partial"
    )
    assert report.finding("G9").reason.startswith("agent_events.payload is unbounded")


def test_G10_outbox_without_pending_index_is_flagged(db: Database, auditor: str) -> None:
    _broken(db, "DROP INDEX agent_outbox_pending_idx", G10="partial")


def test_G11_outbox_without_inbox_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(db, "DROP TABLE agent_inbox", G11="partial")
    assert report.tables["inbox"] is None


def test_G12_lease_without_completeness_check_is_flagged(db: Database, auditor: str) -> None:
    _broken(db, "ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_lease_complete", G12="partial")


def test_G13_operations_without_unsettled_index_are_flagged(db: Database, auditor: str) -> None:
    _broken(db, "DROP INDEX agent_operations_unsettled_idx", G13="partial")


def test_G13_an_index_over_settled_rows_does_not_count(db: Database, auditor: str) -> None:
    # A retention index mentions the state column too, but finds nothing in doubt.
    _broken(
        db,
        """
        DROP INDEX agent_operations_unsettled_idx;
        CREATE INDEX agent_operations_done_idx ON agent_operations (updated_at)
            WHERE state IN ('succeeded', 'failed');
        """,
        G13="partial",
    )


def test_G14_policy_on_a_json_path_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "CREATE POLICY agent_tasks_by_customer ON agent_tasks FOR SELECT TO agentdb_agent "
        "USING ((params ->> 'customer') = current_user)",
        G14="missing",
    )
    assert "policy agent_tasks_by_customer on agent_tasks" in report.finding("G14").reason


def test_G14_index_on_a_json_path_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "CREATE INDEX agent_tasks_priority_idx ON agent_tasks (((params ->> 'priority')::int))",
        G14="partial",
    )
    assert "index agent_tasks_priority_idx" in report.finding("G14").reason


def test_G14_jsonb_subscripting_is_a_json_path_too(db: Database, auditor: str) -> None:
    """params['priority'] (PostgreSQL 14+) reads a field as params ->> 'priority' does."""
    report = _broken(
        db,
        """
        CREATE INDEX agent_tasks_priority_idx ON agent_tasks ((params['priority']));
        CREATE POLICY agent_tasks_by_customer ON agent_tasks FOR SELECT TO agentdb_agent
            USING (params['customer'] = to_jsonb(current_user::text));
        """,
        G14="missing",
    )
    reason = report.finding("G14").reason
    assert "policy agent_tasks_by_customer on agent_tasks" in reason
    assert "index agent_tasks_priority_idx" in _problems(report, "G14")


def test_G15_rls_enabled_but_not_forced_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(db, "ALTER TABLE agent_outbox NO FORCE ROW LEVEL SECURITY", G15="partial")
    assert "enabled but not forced" in report.finding("G15").reason
    assert report.finding("G15").fix == "ALTER TABLE agent_outbox FORCE ROW LEVEL SECURITY;"


@pytest.mark.parametrize(
    "using",
    ["true", "1 = 1", "true OR false", "current_setting('app.admin', true) = 'on'"],
)
def test_G15_policy_opening_every_row_to_public_is_flagged(
    db: Database, auditor: str, using: str
) -> None:
    """A PUBLIC policy whose USING reads no column is true for every row at once (and
    an agent's session can SET a custom setting)."""
    report = _broken(
        db, f"CREATE POLICY agent_tasks_open ON agent_tasks USING ({using})", G15="partial"
    )
    assert "opens every row of agent_tasks to PUBLIC" in report.finding("G15").reason


def test_G15_a_public_policy_that_reads_the_tenant_column_is_not_flagged(
    db: Database, auditor: str
) -> None:
    """Control for the test above: the same PUBLIC policy, scoped by the row's tenant."""
    report = _broken(
        db,
        "CREATE POLICY agent_tasks_scoped ON agent_tasks"
        " USING (tenant_id = current_setting('app.tenant_id', true)::uuid)",
    )
    assert "policy agent_tasks_scoped" in report.finding("G15").evidence


def test_G16_trace_id_without_format_check_is_flagged(db: Database, auditor: str) -> None:
    _broken(
        db,
        "ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_trace_id_format",
        G16="partial",
    )


def test_G17_cascading_foreign_key_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        """
        ALTER TABLE agent_events DROP CONSTRAINT agent_events_task_fkey;
        ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey
            FOREIGN KEY (tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id)
            ON DELETE CASCADE;
        """,
        G17="partial",
    )
    assert (
        "agent_events_task_fkey ON DELETE CASCADE silently deletes" in report.finding("G17").reason
    )


def test_G17_credentials_without_reference_check_are_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "ALTER TABLE agent_credential_refs DROP CONSTRAINT agent_credential_refs_is_reference",
        G17="partial",
    )
    assert (
        "agent_credential_refs.secret_ref may hold a secret value" in report.finding("G17").reason
    )


# --- every fix applies: break one object, apply the audit's own fix, re-audit ----------

_RANK = {"missing": 0, "partial": 1, "enforced": 2}


@pytest.mark.parametrize(
    ("ddl", "gid"),
    [
        ("ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_idempotency_key", "G3"),
        ("CREATE UNIQUE INDEX agent_artifacts_uri_key ON agent_artifacts (uri)", "G3"),
        ("ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_input_hash_format", "G4"),
        ("ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_state_valid", "G5"),
        ("DROP TRIGGER agent_operations_transition_guard ON agent_operations", "G6"),
        ("DROP TRIGGER agent_tasks_version_guard ON agent_tasks", "G7"),
        (
            "DROP TRIGGER agent_events_append_only ON agent_events;"
            "DROP TRIGGER agent_events_no_truncate ON agent_events;"
            "GRANT UPDATE, DELETE, TRUNCATE ON agent_events TO agentdb_runtime",
            "G8",
        ),
        ("ALTER TABLE agent_events DROP CONSTRAINT agent_events_payload_size", "G9"),
        ("DROP INDEX agent_outbox_pending_idx", "G10"),
        ("DROP TABLE agent_inbox", "G11"),
        ("ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_lease_complete", "G12"),
        ("DROP INDEX agent_operations_unsettled_idx", "G13"),
        (
            "CREATE INDEX agent_tasks_priority_idx ON agent_tasks (((params ->> 'priority')::int))",
            "G14",
        ),
        (
            "CREATE POLICY agent_tasks_by_customer ON agent_tasks FOR SELECT TO agentdb_agent "
            "USING ((params ->> 'customer') = current_user)",
            "G14",
        ),
        ("ALTER TABLE agent_outbox NO FORCE ROW LEVEL SECURITY", "G15"),
        ("ALTER TABLE agent_operations DROP CONSTRAINT agent_operations_trace_id_format", "G16"),
        (
            "ALTER TABLE agent_events DROP CONSTRAINT agent_events_task_fkey;"
            "ALTER TABLE agent_events ADD CONSTRAINT agent_events_task_fkey FOREIGN KEY "
            "(tenant_id, task_id) REFERENCES agent_tasks (tenant_id, id) ON DELETE CASCADE",
            "G17",
        ),
        ("DROP TRIGGER agent_operations_for_open_task ON agent_operations", "G20"),
        ("DROP TRIGGER agent_tasks_deadline_guard ON agent_tasks", "G21"),
        ("DROP TRIGGER agent_signals_guard ON agent_signals", "G22"),
        ("ALTER TABLE agent_signals DROP CONSTRAINT agent_signals_seq_key", "G22"),
        ("DROP TRIGGER agent_tasks_fan_in ON agent_tasks", "G23"),
        ("ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_parent_fkey", "G23"),
        ("DROP INDEX agent_tasks_schedule_tick_key", "G24"),
        ("DROP TRIGGER agent_tasks_schedule_guard ON agent_tasks", "G24"),
        ("DROP TRIGGER agent_tasks_schedule_fixed ON agent_tasks", "G24"),
    ],
)
def test_the_suggested_fix_applies_and_restores_the_guarantee(
    db: Database, auditor: str, ddl: str, gid: str
) -> None:
    _apply(db.admin_dsn, ddl)
    broken = audit.audit(db.url(auditor))
    fix = broken.finding(gid).fix
    assert fix, broken.render()
    _apply(db.admin_dsn, fix)  # the audit's own suggestion, on this scratch database
    fixed = audit.audit(db.url(auditor))
    before, after = broken.statuses(), fixed.statuses()
    assert _RANK[after[gid]] > _RANK[before[gid]], (fix, fixed.render())
    assert not {g for g in before if _RANK[after[g]] < _RANK[before[g]]}, (fix, fixed.render())


# --- schemas that are not ours ---------------------------------------------------------

FOREIGN_SQL = """
CREATE TABLE orgs (id uuid PRIMARY KEY, name text NOT NULL);
CREATE TABLE jobs (
    org_id uuid NOT NULL REFERENCES orgs (id),
    id uuid NOT NULL,
    status text NOT NULL CHECK (status IN ('queued', 'running', 'done')),
    version integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, id)
);
CREATE TABLE side_effects (
    org_id uuid NOT NULL,
    id uuid NOT NULL,
    job_id uuid NOT NULL,
    idempotency_key text NOT NULL,
    request_hash text NOT NULL CHECK (request_hash ~ '^[0-9a-f]{64}$'),
    status text NOT NULL,
    PRIMARY KEY (org_id, id),
    UNIQUE (org_id, idempotency_key),
    FOREIGN KEY (org_id, job_id) REFERENCES jobs (org_id, id) ON DELETE CASCADE
);
CREATE TABLE audit_log (org_id uuid NOT NULL, id bigserial, job_id uuid NOT NULL,
    actor text NOT NULL, detail jsonb, PRIMARY KEY (org_id, id),
    FOREIGN KEY (org_id, job_id) REFERENCES jobs (org_id, id));
REVOKE ALL ON audit_log FROM PUBLIC;
"""


@pytest.mark.parametrize(
    ("tenant", "table"),
    [("user", "jobs"), ("tenant_id", "It's 100% jobs")],
    ids=["keyword-column", "quote-and-percent-in-a-table-name"],
)
def test_every_fix_for_a_schema_with_awkward_names_is_valid_sql(
    tenant: str, table: str, pg_server: _pg.Server, empty_db: str
) -> None:
    """A tenant column named `user` was written unquoted into the tables fixes create,
    and a table named "It's 100% jobs" broke the RAISE text of the guards fixes create
    (the quote ends the literal, the % is a placeholder). Each fix runs in a transaction
    that is rolled back; only its syntax is judged (one fix may need another first)."""
    t = '"' + table.replace('"', '""') + '"'
    _apply(
        pg_server.url(empty_db),
        f"""
        CREATE TABLE {t} ("{tenant}" uuid NOT NULL, id uuid NOT NULL, state text NOT NULL,
                          state_version bigint NOT NULL, idempotency_key text NOT NULL,
                          PRIMARY KEY ("{tenant}", id));
        """,
    )
    report = audit.audit(
        _as_auditor(pg_server, empty_db), mapping={"tenant": tenant, "tasks": table}
    )
    fixes = [f.fix for f in report.findings if f.fix]
    assert len(fixes) >= 5, report.render()
    refused = []
    with _pg.admin(pg_server.url(empty_db)) as conn:
        for fix in fixes:
            conn.execute("BEGIN")
            try:
                conn.execute(fix.encode())  # the audit's own suggestion, rolled back
            except psycopg.errors.SyntaxError as exc:
                refused.append((fix, exc))
            except psycopg.Error:
                pass
            finally:
                conn.execute("ROLLBACK")
    assert not refused, refused


@pytest.mark.parametrize("granted", [True, False], ids=["partitions-granted", "root-only"])
def test_G15_a_partition_granted_without_row_level_security_of_its_own_is_flagged(
    granted: bool, pg_server: _pg.Server, empty_db: str
) -> None:
    """The root's policies do not apply to a query that names a partition: a role
    granted the partitions (GRANT ... ON ALL TABLES IN SCHEMA) read every tenant's rows
    through them, while the audit said G15 held."""
    grant = (
        "GRANT SELECT ON ALL TABLES IN SCHEMA public TO agentdb_test_auditor;"
        if granted
        else "GRANT SELECT ON jobs TO agentdb_test_auditor;"
    )
    _apply(
        pg_server.url(empty_db),
        f"""
        CREATE TABLE jobs (tenant_id uuid NOT NULL, id uuid NOT NULL,
                           PRIMARY KEY (tenant_id, id)) PARTITION BY HASH (tenant_id);
        CREATE TABLE jobs_p0 PARTITION OF jobs FOR VALUES WITH (MODULUS 2, REMAINDER 0);
        CREATE TABLE jobs_p1 PARTITION OF jobs FOR VALUES WITH (MODULUS 2, REMAINDER 1);
        ALTER TABLE jobs ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
        CREATE POLICY jobs_scope ON jobs
            USING (tenant_id = current_setting('app.tenant_id', true)::uuid);
        {grant}
        """,
    )
    report = audit.audit(_as_auditor(pg_server, empty_db), mapping={"tasks": "jobs"})
    exposed = [p for p in report.finding("G15").problems if "has no forced row-level" in p]
    if granted:
        assert [p.split(" of ")[0] for p in exposed] == [
            "partition public.jobs_p0",
            "partition public.jobs_p1",
        ], report.render()
    else:
        assert exposed == [], report.render()


@pytest.mark.parametrize("null", ["", "NOT NULL"], ids=["nullable", "not-null"])
def test_G17_a_nullable_tenant_column_is_anchored_by_nothing(
    null: str, pg_server: _pg.Server, empty_db: str
) -> None:
    """A foreign key skips NULL: `tenant_id uuid REFERENCES tenants` lets a row with no
    tenant outlive every tenant's deletion, while the audit said G17 held."""
    _apply(
        pg_server.url(empty_db),
        f"""
        CREATE TABLE tenants (id uuid PRIMARY KEY);
        CREATE TABLE jobs (tenant_id uuid {null} REFERENCES tenants, id uuid PRIMARY KEY,
                           state text NOT NULL CHECK (state IN ('queued', 'done')));
        """,
    )
    report = audit.audit(_as_auditor(pg_server, empty_db), mapping={"tasks": "jobs"})
    problems = _problems(report, "G17")
    if null:
        assert "may be NULL" not in problems, report.render()
    else:
        assert "jobs.tenant_id may be NULL" in problems, report.render()
        assert "ALTER TABLE jobs ALTER COLUMN tenant_id SET NOT NULL;" in (
            report.finding("G17").fix or ""
        )


def test_foreign_schema_is_found_by_heuristics_with_a_mapped_tenant_column(
    pg_server: _pg.Server, empty_db: str
) -> None:
    _apply(pg_server.url(empty_db), FOREIGN_SQL)
    report = audit.audit(_as_auditor(pg_server, empty_db), mapping={"tenant": "org_id"})
    assert {k: r.name if r else None for k, r in report.tables.items()} == {
        "tasks": "jobs",
        "operations": "side_effects",
        "events": "audit_log",
        "outbox": None,
        "inbox": None,
        "tenants": "orgs",
        "credentials": None,
    }
    s = report.statuses()
    assert s["G1"] == "enforced"  # side_effects -> jobs, jobs.run_at
    assert s["G2"] == "enforced"  # org_id in every key and link
    assert s["G3"] == "enforced"
    assert s["G4"] == "enforced"  # request_hash, NOT NULL, format CHECK
    assert s["G5"] == "partial"  # side_effects.status is free text
    assert s["G17"] == "partial"  # ON DELETE CASCADE from side_effects to jobs
    assert "side_effects_org_id_job_id_fkey ON DELETE CASCADE" in report.finding("G17").reason


def test_map_names_tables_the_heuristics_cannot_find(pg_server: _pg.Server, empty_db: str) -> None:
    _apply(
        pg_server.url(empty_db),
        """
        CREATE TABLE work_items (tenant_id uuid NOT NULL, id uuid NOT NULL,
                                 phase text NOT NULL, PRIMARY KEY (tenant_id, id));
        CREATE TABLE calls (tenant_id uuid NOT NULL, id uuid NOT NULL, item_id uuid NOT NULL,
                            call_key text NOT NULL, PRIMARY KEY (tenant_id, id));
        """,
    )
    dsn = _as_auditor(pg_server, empty_db)
    unmapped = audit.audit(dsn)
    assert unmapped.tables["tasks"] is None
    assert unmapped.finding("G1").status == "missing"
    mapped = audit.audit(dsn, mapping={"tasks": "work_items", "outbox": "-"})
    assert mapped.tables["tasks"] == audit.TableRef("work_items", "map")
    assert mapped.finding("G1").reason.startswith("no operation table apart from work_items")


def test_G1_effects_kept_on_the_task_row_are_flagged(pg_server: _pg.Server, empty_db: str) -> None:
    _apply(
        pg_server.url(empty_db),
        """
        CREATE TABLE jobs (tenant_id uuid NOT NULL, id uuid NOT NULL, state text NOT NULL,
                           idempotency_key text NOT NULL, PRIMARY KEY (tenant_id, id));
        """,
    )
    report = audit.audit(_as_auditor(pg_server, empty_db))
    assert report.tables["tasks"] == audit.TableRef("jobs", "heuristic")
    assert report.tables["operations"] is None
    assert report.finding("G1").status == "missing"


def test_a_unique_key_counts_for_a_partitioned_table_only_on_every_partition(
    pg_server: _pg.Server, empty_db: str
) -> None:
    # pg-boss's shape: the root has no unique index, its partitions do.
    _apply(
        pg_server.url(empty_db),
        """
        CREATE TABLE jobs (queue text NOT NULL, id bigint NOT NULL, status text NOT NULL,
                           run_at timestamptz, attempts int NOT NULL DEFAULT 0,
                           dedupe_key text, PRIMARY KEY (queue, id)) PARTITION BY LIST (queue);
        CREATE TABLE jobs_a PARTITION OF jobs FOR VALUES IN ('a');
        CREATE TABLE jobs_b PARTITION OF jobs FOR VALUES IN ('b');
        CREATE UNIQUE INDEX jobs_a_key ON jobs_a (queue, dedupe_key);
        """,
    )
    dsn = _as_auditor(pg_server, empty_db)
    report = audit.audit(dsn)
    assert report.tables["tasks"] == audit.TableRef("jobs", "heuristic")
    assert "nothing makes jobs.dedupe_key unique" in _problems(report, "G3")
    _apply(pg_server.url(empty_db), "CREATE UNIQUE INDEX jobs_b_key ON jobs_b (queue, dedupe_key)")
    report = audit.audit(dsn)
    assert "nothing makes jobs.dedupe_key unique" not in _problems(report, "G3")
    assert "unique jobs_a_key" in report.finding("G3").evidence


def test_views_are_not_tables_foreign_unlogged_and_inherited_ones_are(
    pg_server: _pg.Server, empty_db: str
) -> None:
    _apply(
        pg_server.url(empty_db),
        """
        CREATE FOREIGN DATA WRAPPER audit_test_fdw;
        CREATE SERVER audit_test_srv FOREIGN DATA WRAPPER audit_test_fdw;
        CREATE TYPE job_state AS ENUM ('queued', 'running', 'done');
        CREATE DOMAIN short_key AS text CHECK (length(VALUE) < 64);
        CREATE UNLOGGED TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            status job_state NOT NULL, run_at timestamptz, attempts int NOT NULL DEFAULT 0,
            dedupe_key short_key, doubled int GENERATED ALWAYS AS (attempts * 2) STORED);
        CREATE TABLE urgent_jobs (priority int) INHERITS (jobs);
        CREATE VIEW job_view AS SELECT * FROM jobs;
        CREATE FOREIGN TABLE remote_jobs (id bigint, status text) SERVER audit_test_srv;
        CREATE SCHEMA other;
        CREATE TABLE other.job_log (id bigserial PRIMARY KEY, job_id bigint NOT NULL,
                                    type text NOT NULL);
        """,
    )
    with audit._read_only(_as_auditor(pg_server, empty_db)) as conn:
        cat = catalog.snapshot(conn, None)
    assert {t.name: t.kind for t in cat.tables.values()} == {
        "jobs": "r",
        "urgent_jobs": "r",
        "remote_jobs": "f",
    }
    assert cat.tables["jobs"].persistence == "u"
    assert cat.tables["jobs"].columns["status"].enum_labels == ("queued", "running", "done")
    assert cat.tables["jobs"].columns["doubled"].generated
    report = audit.audit(_as_auditor(pg_server, empty_db))
    assert report.tables["tasks"] == audit.TableRef("jobs", "heuristic")
    other = audit.audit(_as_auditor(pg_server, empty_db), schema="other")
    assert other.tables["events"] == audit.TableRef("job_log", "heuristic")


# --- bad input -------------------------------------------------------------------------


def test_unreachable_dsn_is_one_line() -> None:
    _one_line(_cli("--dsn", "postgresql://nobody@127.0.0.1:1/db"), 1, "cannot connect")


def test_unknown_database_is_one_line(pg_server: _pg.Server) -> None:
    _one_line(_cli("--dsn", pg_server.url("agentdb_no_such_db")), 1, "cannot connect")


def test_no_dsn_is_one_line() -> None:
    _one_line(_cli(), 2, "DATABASE_URL")


def test_unknown_schema_is_one_line(article_dsn: str) -> None:
    _one_line(_cli("--dsn", article_dsn, "--schema", "nope"), 2, "schema 'nope' does not exist")


def test_map_naming_a_missing_table_is_one_line(article_dsn: str) -> None:
    _one_line(
        _cli("--dsn", article_dsn, "--map", "tasks=my_jobs"),
        2,
        "--map tasks=my_jobs: no table 'my_jobs' in schema 'public'",
    )


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("jobs=agent_tasks", "--map key 'jobs' is unknown"),
        ("tasks", "must be KEY=TABLE"),
        ("tasks=agent_tasks,tasks=agent_operations", "names 'tasks' twice"),
        ("tenant=org_id", "no table in schema 'public' has a column 'org_id'"),
        # A mapped table must have the columns its role is judged by.
        ("operations=agent_events", "agent_events has no idempotency key column"),
        ("tasks=agent_tasks,operations=agent_events", "agent_events has no idempotency key"),
        ("inbox=agent_tasks", "agent_tasks has no message id column"),
    ],
)
def test_malformed_map_is_one_line(article_dsn: str, spec: str, fragment: str) -> None:
    _one_line(_cli("--dsn", article_dsn, "--map", spec), 2, fragment)


def test_python_api_raises_configuration_error_for_a_missing_table(article_dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="no table 'nope'"):
        audit.audit(article_dsn, mapping={"events": "nope"})
    with pytest.raises(DatabaseUnavailable):
        audit.audit("postgresql://nobody@127.0.0.1:1/db")


def test_exit_code_follows_fail_on(article_dsn: str) -> None:
    report = audit.audit(article_dsn)
    assert report.exit_code(None) == 0
    assert report.exit_code("missing") == audit.EXIT_FINDINGS
    assert report.exit_code("partial") == audit.EXIT_FINDINGS
    with pytest.raises(ConfigurationError):
        report.exit_code("sometimes")


# --- JSON output ---------------------------------------------------------------------------


def _is_type(value: Any, name: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
    }[name]


def _validate(
    value: Any, schema: dict[str, Any], path: str = "$", root: dict[str, Any] | None = None
) -> None:
    """The subset of JSON Schema that JSON_SCHEMA uses (no dependency for it)."""
    root = schema if root is None else root
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        schema = root["$defs"][name]
    if "const" in schema:
        assert value == schema["const"], path
    if "enum" in schema:
        assert value in schema["enum"], path
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert any(_is_type(value, t) for t in types), (path, value)
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}.{key} missing"
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), (path, set(value) - set(props))
        for key, item in value.items():
            if key in props:
                _validate(item, props[key], f"{path}.{key}", root)
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), path
        assert len(value) <= schema.get("maxItems", len(value)), path
        for i, item in enumerate(value):
            if "items" in schema:
                _validate(item, schema["items"], f"{path}[{i}]", root)
    if isinstance(value, str) and "pattern" in schema:
        assert re.search(schema["pattern"], value), (path, value)
    if _is_type(value, "integer") and "minimum" in schema:
        assert value >= schema["minimum"], path


def test_json_output_validates_against_the_documented_schema(
    article_dsn: str, agentdb_dsn: str
) -> None:
    for dsn in (article_dsn, agentdb_dsn):
        result = _cli("--dsn", dsn, "--json")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        _validate(doc, audit.JSON_SCHEMA)
        assert doc["version"] == 1
        assert sum(doc["summary"].values()) == len(GUARANTEES)
    # The validator is not vacuous.
    doc.pop("version")
    with pytest.raises(AssertionError):
        _validate(doc, audit.JSON_SCHEMA)


def test_the_audit_page_documents_the_json_schema() -> None:
    section = (ROOT / "docs" / "audit.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    assert audit.JSON_SCHEMA in [json.loads(b) for b in blocks]


# --- read-only --------------------------------------------------------------------------------


def test_audit_needs_no_privileges_and_writes_nothing(db: Database, auditor: str) -> None:
    with _pg.admin(db.admin_dsn) as conn:
        row = conn.execute(
            "SELECT has_table_privilege(%s, 'agent_tasks', 'SELECT'),"
            " has_schema_privilege(%s, 'public', 'CREATE')",
            (auditor, auditor),
        ).fetchone()
    assert row == (False, False)
    before = _pg.schema_dump(db.admin_dsn)
    report = audit.audit(db.url(auditor))
    assert report.role == auditor
    assert _pg.schema_dump(db.admin_dsn) == before


def test_audit_transaction_is_read_only(agentdb_dsn: str) -> None:
    # Whatever ran on the audit's connection could not write; the refusal is
    # mapped on its SQLSTATE (25006 read_only_sql_transaction).
    with (
        pytest.raises(audit.AuditError, match="SQLSTATE 25006"),
        audit._read_only(agentdb_dsn) as conn,
    ):
        conn.execute("CREATE TABLE audit_wrote_this (id int)")


def test_parse_mapping_accepts_repeated_and_comma_separated_options() -> None:
    assert audit.parse_mapping(["tasks=a, operations=b", "events=-", "tenant=org"]) == {
        "tasks": "a",
        "operations": "b",
        "events": "-",
        "tenant": "org",
    }


def test_read_only_role_sees_the_same_as_the_owner(db: Database, auditor: str) -> None:
    as_auditor = audit.audit(db.url(auditor))
    as_owner = audit.audit(db.admin_dsn)
    for a, o in zip(as_auditor.findings, as_owner.findings, strict=True):
        if a.guarantee != "G15":  # G15 also judges the connecting role
            assert (a.status, a.evidence) == (o.status, o.evidence), a.guarantee


def test_G19_a_budget_without_its_limit_check_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        "ALTER TABLE agent_budgets DROP CONSTRAINT agent_budgets_within_limit",
        G19="partial",
    )
    assert "no CHECK ties spent, held to limit_amount" in _problems(report, "G19")
    assert "spent + held <= limit_amount" in (report.finding("G19").fix or "")


def test_G19_rate_limits_no_trigger_counts_are_flagged(db: Database, auditor: str) -> None:
    report = _broken(
        db,
        """
        DROP TRIGGER agent_operations_rate_limit ON agent_operations;
        DROP TRIGGER agent_operations_rate_limit_retry ON agent_operations;
        """,
        G19="partial",
    )
    assert "no trigger on agent_operations reads it" in _problems(report, "G19")


def test_G19_no_budgets_and_no_rate_limits_is_missing(db: Database, auditor: str) -> None:
    _broken(
        db,
        """
        ALTER TABLE agent_budgets DROP CONSTRAINT agent_budgets_within_limit;
        DROP TRIGGER agent_operations_rate_limit ON agent_operations;
        DROP TRIGGER agent_operations_rate_limit_retry ON agent_operations;
        """,
        G19="missing",
    )


def test_G20_operations_nothing_refuses_for_a_finished_task_are_flagged(
    db: Database, auditor: str
) -> None:
    report = _broken(
        db,
        """
        DROP TRIGGER agent_operations_for_open_task ON agent_operations;
        DROP TRIGGER agent_operations_for_open_task_retry ON agent_operations;
        """,
        G20="missing",
    )
    assert "no trigger on agent_operations reads agent_tasks" in report.finding("G20").reason
    fix = report.finding("G20").fix or ""
    assert "t.tenant_id = NEW.tenant_id AND t.id = NEW.task_id" in fix
    assert "'cancelled'" in fix
    assert "FOR SHARE" in fix


async def test_G21_a_deadline_nothing_guards_is_flagged(
    db: Database,
    auditor: str,
    pool: asyncpg.Pool,
    tenants: Tenants,
    runtime_conn: asyncpg.Connection,
) -> None:
    report = _broken(db, "DROP TRIGGER agent_tasks_deadline_guard ON agent_tasks", G21="missing")
    assert "no trigger on agent_tasks reads the old deadline_at" in report.finding("G21").reason
    fix = report.finding("G21").fix or ""
    assert "IF OLD.deadline_at <= now()" in fix
    assert "'dead'" in fix
    # The suggestion, applied, refuses what G21 is about - a late task kept alive - and
    # lets a late task end (the control).
    _apply(db.admin_dsn, fix)
    past = datetime.now(UTC) - timedelta(hours=1)
    ends, lives = [await tasks.create(pool, tenants.a, "x", deadline=past) for _ in range(2)]
    conn = runtime_conn
    await F.update_task(conn, tenants.a, ends.id, state="dead", state_version=1)
    with pytest.raises(asyncpg.CheckViolationError, match="passed its deadline"):
        await F.update_task(conn, tenants.a, lives.id, state="waiting", state_version=1)


async def test_G22_signals_nothing_checks_against_their_task_are_flagged(
    db: Database, auditor: str, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    report = _broken(db, "DROP TRIGGER agent_signals_guard ON agent_signals", G22="missing")
    assert "no trigger on agent_signals reads agent_tasks" in report.finding("G22").reason
    fix = report.finding("G22").fix or ""
    assert "FOR NO KEY UPDATE" in fix
    assert "'cancelled'" in fix
    # The suggestion, applied, refuses what G22 is about - a signal to a finished task -
    # and takes one to an open task (the control). (The seq the dropped guard gave is
    # supplied by hand here: the suggestion leaves numbering to the schema.)
    _apply(db.admin_dsn, fix)
    open_, over = [await tasks.create(pool, tenants.a, "x") for _ in range(2)]
    await tasks.cancel(pool, tenants.a, over.id)
    await F.signal(admin_conn, tenants.a, open_.id, seq=1)
    with pytest.raises(asyncpg.CheckViolationError, match="takes no more signals"):
        await F.signal(admin_conn, tenants.a, over.id, seq=1)


def test_G22_signals_without_an_order_are_partial(db: Database, auditor: str) -> None:
    report = _broken(
        db, "ALTER TABLE agent_signals DROP CONSTRAINT agent_signals_seq_key", G22="partial"
    )
    assert "gives a signal its place in its task's order" in _problems(report, "G22")


def test_G22_a_schema_without_signals_is_not_applicable(db: Database, auditor: str) -> None:
    _broken(db, "DROP TABLE agent_signals", G22="not_applicable")


def test_G23_a_fan_in_left_to_the_workers_is_flagged(db: Database, auditor: str) -> None:
    report = _broken(db, "DROP TRIGGER agent_tasks_fan_in ON agent_tasks", G23="missing")
    assert (
        "no trigger on agent_tasks reads parent_id after an update" in report.finding("G23").reason
    )
    fix = report.finding("G23").fix or ""
    assert "FOR UPDATE" in fix
    assert "AFTER UPDATE OF state" in fix


def test_G23_a_parent_reference_without_the_tenant_is_partial(db: Database, auditor: str) -> None:
    report = _broken(
        db, "ALTER TABLE agent_tasks DROP CONSTRAINT agent_tasks_parent_fkey", G23="partial"
    )
    assert "a child can name another tenant's task" in _problems(report, "G23")


async def _schedule(admin: asyncpg.Connection, tenant: uuid.UUID) -> tuple[uuid.UUID, datetime]:
    """A schedule of ``tenant`` every minute since an hour ago, and its latest due tick."""
    anchor = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    sid: uuid.UUID = await F.insert(
        admin,
        "agent_schedules",
        {"tenant_id": tenant, "name": "hourly", "task_type": "x", "every": timedelta(minutes=1),
         "anchor": anchor, "next_tick_at": anchor},
    )  # fmt: skip
    return sid, anchor + timedelta(minutes=30)


async def test_G24_a_tick_nothing_keeps_unique_is_missing(
    db: Database, auditor: str, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    report = _broken(db, "DROP INDEX agent_tasks_schedule_tick_key", G24="missing")
    assert (
        "no unique key on agent_tasks holds agent_tasks.schedule_id and a tick"
        in report.finding("G24").reason
    )
    fix = report.finding("G24").fix or ""
    assert "UNIQUE (tenant_id, schedule_id, schedule_tick)" in fix
    # The suggestion, applied, refuses what G24 is about - a second task for one tick, as
    # a second scheduler that found it unfired would insert it - and takes the next tick.
    _apply(db.admin_dsn, fix)
    sid, tick = await _schedule(admin_conn, tenants.a)
    await F.create_task(admin_conn, tenants.a, schedule_id=sid, schedule_tick=tick)
    with pytest.raises(asyncpg.UniqueViolationError, match="agent_tasks_schedule_tick_key"):
        await F.create_task(admin_conn, tenants.a, schedule_id=sid, schedule_tick=tick)
    await F.create_task(
        admin_conn, tenants.a, schedule_id=sid, schedule_tick=tick + timedelta(minutes=1)
    )


async def test_G24_ticks_nothing_checks_against_their_schedule_are_partial(
    db: Database, auditor: str, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    report = _broken(db, "DROP TRIGGER agent_tasks_schedule_guard ON agent_tasks", G24="partial")
    assert "no trigger on agent_tasks reads agent_schedules when a task is inserted" in (
        _problems(report, "G24")
    )
    fix = report.finding("G24").fix or ""
    assert "k.tenant_id = NEW.tenant_id AND k.id = NEW.schedule_id" in fix
    # The suggestion, applied, refuses a tick off the rule, in the future or of another
    # tenant's schedule, and takes a due tick (the control).
    _apply(db.admin_dsn, fix)
    sid, tick = await _schedule(admin_conn, tenants.a)
    for tenant, at in [
        (tenants.a, tick + timedelta(milliseconds=500)),
        (tenants.a, datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=5)),
        (tenants.b, tick),
    ]:
        with pytest.raises(asyncpg.CheckViolationError, match="is not a due tick of schedule"):
            await F.create_task(admin_conn, tenant, schedule_id=sid, schedule_tick=at)
    await F.create_task(admin_conn, tenants.a, schedule_id=sid, schedule_tick=tick)


def test_G24_a_tick_that_can_be_moved_is_partial(db: Database, auditor: str) -> None:
    report = _broken(db, "DROP TRIGGER agent_tasks_schedule_fixed ON agent_tasks", G24="partial")
    assert "nothing refuses a change of a task's schedule_id or schedule_tick" in (
        report.finding("G24").reason
    )


def test_G24_a_schema_without_schedules_is_not_applicable(db: Database, auditor: str) -> None:
    report = _broken(db, "DROP TABLE agent_schedules CASCADE", G24="not_applicable")
    assert "no schedule table" in report.finding("G24").reason


def test_G24_a_foreign_scheduler_without_a_tick_key_is_missing_and_the_fix_applies(
    pg_server: _pg.Server, empty_db: str
) -> None:
    # A single-tenant queue whose scheduler reads next_run_at and inserts the job in
    # code: nothing in the schema says which tick a job is.
    _apply(
        pg_server.url(empty_db),
        """
        CREATE TABLE jobs (id bigserial PRIMARY KEY, status text NOT NULL,
                           run_at timestamptz NOT NULL DEFAULT now());
        CREATE TABLE recurring_jobs (id bigserial PRIMARY KEY, cron text NOT NULL,
                                     next_run_at timestamptz NOT NULL);
        """,
    )
    dsn = _as_auditor(pg_server, empty_db)
    broken = audit.audit(dsn)
    f = broken.finding("G24")
    assert f.status == "missing", broken.render()
    assert "no unique key on jobs holds a reference to recurring_jobs and a tick" in f.reason
    assert f.fix is not None
    assert "ADD COLUMN schedule_id bigint" in f.fix
    _apply(pg_server.url(empty_db), f.fix)
    fixed = audit.audit(dsn).finding("G24")
    assert fixed.status == "enforced", fixed
    assert "unique key jobs_schedule_tick_key" in fixed.evidence


def test_a_saas_schema_tenanted_by_org_id_is_not_called_single_tenant(
    pg_server: _pg.Server, empty_db: str
) -> None:
    """No tenant_id, but org_id on the tables: the report names org_id and the --map line to
    use, instead of calling the schema single-tenant; with that --map it is judged."""
    _apply(
        pg_server.url(empty_db),
        """
        CREATE TABLE orgs (id uuid PRIMARY KEY);
        CREATE TABLE jobs (id uuid PRIMARY KEY, org_id uuid NOT NULL REFERENCES orgs,
                           state text NOT NULL, run_at timestamptz NOT NULL DEFAULT now(),
                           attempts int NOT NULL DEFAULT 0);
        CREATE TABLE job_events (id bigserial PRIMARY KEY, org_id uuid NOT NULL,
                                 job_id uuid NOT NULL REFERENCES jobs, event_type text);
        """,
    )
    dsn = _as_auditor(pg_server, empty_db)
    result = _cli("--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert "single-tenant" not in result.stdout, result.stdout
    assert (
        "note: no table has a tenant_id column, but 2 have org_id: if that is the tenant, "
        "run again with --map tenant=org_id" in result.stdout
    ), result.stdout
    report = audit.audit(dsn)
    for gid in ("G2", "G15", "G17", "G18"):
        assert "--map tenant=org_id" in report.finding(gid).reason, report.finding(gid)
    mapped = audit.audit(dsn, mapping={"tenant": "org_id"})
    assert mapped.finding("G2").status != "not_applicable", mapped.render()
