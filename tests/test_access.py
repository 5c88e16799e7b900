"""G15: the agent role sees and writes only its own tenant, through approved paths.

Also the roles story: migrating as an owner without CREATEROLE works both
when the agentdb roles already exist and when they don't (then a DBA creates
them and `agentdb grant` finishes the job).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import psycopg
import pytest

from agentdb import migrate
from agentdb.tools.cli import main as cli
from tests import _pg
from tests import factories as F
from tests.conftest import (
    AGENT_A,
    AGENT_B,
    AGENT_UNPINNED,
    OPERATOR,
    STRANGER,
    Database,
    Tenants,
)

AGENT_SCOPED = (
    "agent_tasks",
    "agent_operations",
    "agent_events",
    "agent_artifacts",
    "agent_signals",
    "agent_steps",
)
# The tables an operator's console reads (and some of them writes), one tenant at a time.
OPERATOR_SCOPED = (
    "agent_tasks",
    "agent_operations",
    "agent_events",
    "agent_outbox",
    "agent_signals",
    "agent_steps",
    "agent_budgets",
    "agent_budget_holds",
    "agent_concurrency_limits",
)
TENANT_TABLES = (
    "agent_tenants",
    "agent_tasks",
    "agent_operations",
    "agent_events",
    "agent_outbox",
    "agent_inbox",
    "agent_artifacts",
    "agent_credential_refs",
    "agent_concurrency_limits",
    "agent_budgets",
    "agent_budget_holds",
    "agent_rate_limits",
    "agent_signals",
    "agent_schedules",
    "agent_steps",
)
# Table names below come from the constants above, never from data.
_COUNT = (
    "SELECT count(*) FILTER (WHERE {col} = $1), count(*) FILTER (WHERE {col} <> $1) FROM {table}"
)


def _count_sql(table: str) -> str:
    col = "id" if table == "agent_tenants" else "tenant_id"
    return _COUNT.format(col=col, table=table)


async def _seed(conn: asyncpg.Connection, tenant: uuid.UUID) -> None:
    """One row of every tenant-owned kind for ``tenant``."""
    task_id = await F.create_task(conn, tenant)
    op_id = await F.create_operation(conn, tenant, task_id)
    await F.signal(conn, tenant, task_id)
    # A step is written under the task's lease (G25): the task is claimed first.
    await F.claim_task(conn, tenant, task_id)
    await F.insert(
        conn,
        "agent_steps",
        {"tenant_id": tenant, "task_id": task_id, "name": "plan", "kind": "step",
         "input_hash": F.HASH, "lease_token": 1},
    )  # fmt: skip
    await F.insert(conn, "agent_outbox", {"tenant_id": tenant, "topic": "t", "task_id": task_id})
    await F.insert(
        conn, "agent_inbox", {"tenant_id": tenant, "consumer": "c", "message_id": uuid.uuid4()}
    )
    await F.insert(
        conn,
        "agent_artifacts",
        {
            "tenant_id": tenant,
            "kind": "k",
            "uri": "s3://b/k",
            "task_id": task_id,
            "operation_id": op_id,
        },
    )
    await F.insert(
        conn,
        "agent_credential_refs",
        {"tenant_id": tenant, "name": "openai", "provider": "openai", "secret_ref": "vault://x"},
    )
    await conn.execute(
        "INSERT INTO agent_concurrency_limits (tenant_id, max_running) VALUES ($1, 3)", tenant
    )
    budget = await conn.fetchval(
        "INSERT INTO agent_budgets (tenant_id, unit, limit_amount, held)"
        " VALUES ($1, 'tokens', 10, 4) RETURNING id",
        tenant,
    )
    await conn.execute(
        "INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id, unit, amount)"
        " VALUES ($1, $2, 1, $3, 'tokens', 4)",
        tenant,
        op_id,
        budget,
    )
    await conn.execute(
        "INSERT INTO agent_rate_limits (tenant_id, action, max_calls, per)"
        " VALUES ($1, 'chat', 5, interval '1 minute')",
        tenant,
    )
    await conn.execute(
        "INSERT INTO agent_schedules (tenant_id, name, task_type, every, anchor, next_tick_at)"
        " VALUES ($1, 'hourly', 'report', interval '1 hour', date_trunc('hour', now()),"
        " date_trunc('hour', now()) + interval '1 hour')",
        tenant,
    )


@pytest.fixture
async def seeded(db: Database, tenants: Tenants, admin_conn: asyncpg.Connection) -> Tenants:
    await _seed(admin_conn, tenants.a)
    await _seed(admin_conn, tenants.b)
    return tenants


_POLICY = """
SELECT p.polcmd::text, array(SELECT r.rolname::text FROM pg_roles r WHERE r.oid = ANY (p.polroles))
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE p.polname = $1 AND c.relname = $2
"""


async def _assert_policy(
    conn: asyncpg.Connection, table: str, suffix: str, role: str, cmd: str
) -> None:
    """The policy this test exercises exists on ``table``, for ``role``, for ``cmd`` (r or *)."""
    row = await conn.fetchrow(_POLICY, f"{table}_{suffix}", table)
    assert row is not None, f"{table}_{suffix} missing"
    assert (row[0], row[1]) == (cmd, [role]), f"{table}_{suffix}"


async def _visible(conn: asyncpg.Connection, table: str, tenant: uuid.UUID) -> tuple[int, int]:
    row = await conn.fetchrow(_count_sql(table), tenant)
    assert row is not None
    return int(row[0]), int(row[1])


async def test_G15_agent_sees_only_its_own_tenant(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    for table in (*AGENT_SCOPED, "agent_tenants"):
        await _assert_policy(admin_conn, table, "agent_scope", "agentdb_agent", "r")
    for role, own in ((AGENT_A, seeded.a), (AGENT_B, seeded.b)):
        conn = await db.connect(role)
        try:
            for table in (*AGENT_SCOPED, "agent_tenants"):
                mine, others = await _visible(conn, table, own)
                assert mine > 0, f"{role} should see its own {table} rows"
                assert others == 0, f"{role} saw another tenant's {table} rows"
        finally:
            await conn.close()


async def test_G15_pinned_agent_cannot_escape_with_setting_or_set_role(
    db: Database, seeded: Tenants
) -> None:
    conn = await db.connect(AGENT_A)
    try:
        await conn.execute("SELECT set_config('agentdb.tenant_id', $1, false)", str(seeded.b))
        assert await _visible(conn, "agent_tasks", seeded.b) == (0, 1)
        # A member may SET ROLE to the group role; the pin follows the login.
        await conn.execute("SET ROLE agentdb_agent")
        assert await _visible(conn, "agent_tasks", seeded.b) == (0, 1)
    finally:
        await conn.close()


async def test_G15_temp_table_cannot_shadow_the_principal_map(
    db: Database, seeded: Tenants
) -> None:
    conn = await db.connect(AGENT_A)
    try:
        await conn.execute("CREATE TEMP TABLE agent_principals (role_name text, tenant_id uuid)")
        await conn.execute("INSERT INTO agent_principals VALUES ($1, $2)", AGENT_A, seeded.b)
        assert await _visible(conn, "agent_tasks", seeded.b) == (0, 1)
    finally:
        await conn.close()


async def test_G6_temp_table_cannot_shadow_the_transition_graph(
    db: Database, tenants: Tenants, runtime_conn: asyncpg.Connection
) -> None:
    await runtime_conn.execute(
        "CREATE TEMP TABLE agent_transitions AS SELECT 'task'::text AS entity,"
        " 'pending'::text AS from_state, 'succeeded'::text AS to_state"
    )
    task_id = await F.create_task(runtime_conn, tenants.a)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await F.update_task(runtime_conn, tenants.a, task_id, state="succeeded", state_version=1)
    assert refused.value.sqlstate == "AG001"
    assert refused.value.constraint_name == "agent_tasks_transition_guard"


async def test_G15_unpinned_agent_is_scoped_per_transaction(db: Database, seeded: Tenants) -> None:
    conn = await db.connect(AGENT_UNPINNED)
    try:
        assert await _visible(conn, "agent_tasks", seeded.a) == (0, 0)
        async with conn.transaction():
            await conn.execute("SELECT set_config('agentdb.tenant_id', $1, true)", str(seeded.b))
            assert await _visible(conn, "agent_tasks", seeded.b) == (1, 0)
        # SET LOCAL ended with the transaction: a pooled connection does not leak scope.
        assert await _visible(conn, "agent_tasks", seeded.b) == (0, 0)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("statement", "table", "privilege"),
    [
        (
            "INSERT INTO agent_tasks (tenant_id, task_type, workflow_version)"
            " VALUES ($1, 't', 'v')",
            "agent_tasks",
            "INSERT",
        ),
        ("UPDATE agent_tasks SET current_step = 'x' WHERE tenant_id = $1", "agent_tasks", "UPDATE"),
        ("DELETE FROM agent_tasks WHERE tenant_id = $1", "agent_tasks", "DELETE"),
        (
            "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version)"
            " SELECT $1, id, 'forged', 'me', 'p' FROM agent_tasks LIMIT 1",
            "agent_events",
            "INSERT",
        ),
        ("SELECT count(*) FROM agent_outbox WHERE tenant_id = $1", "agent_outbox", "SELECT"),
        ("SELECT count(*) FROM agent_inbox WHERE tenant_id = $1", "agent_inbox", "SELECT"),
        (
            "SELECT secret_ref FROM agent_credential_refs WHERE tenant_id = $1",
            "agent_credential_refs",
            "SELECT",
        ),
        (
            "UPDATE agent_operations SET state = 'succeeded' WHERE tenant_id = $1",
            "agent_operations",
            "UPDATE",
        ),
    ],
)
async def test_G15_agent_has_no_direct_writes_or_hidden_tables(
    db: Database, seeded: Tenants, statement: str, table: str, privilege: str
) -> None:
    """Refused by the missing GRANT (42501), not by a policy: the privilege itself is absent."""
    conn = await db.connect(AGENT_A)
    try:
        assert await conn.fetchval("SELECT count(*) FROM agent_tasks") == 1  # control
        assert await conn.fetchval("SELECT has_table_privilege($1, 'SELECT')", "agent_tasks")
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.execute(statement, seeded.a)
        assert refused.value.sqlstate == "42501"
        # RLS would refuse with the same SQLSTATE; which one did is read from the catalog.
        assert not await conn.fetchval("SELECT has_table_privilege($1, $2)", table, privilege)
    finally:
        await conn.close()


async def test_G15_request_task_writes_only_into_the_callers_tenant(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    conn = await db.connect(AGENT_A)
    try:
        task_id = await conn.fetchval("SELECT agentdb_request_task('triage', 'v1')")
    finally:
        await conn.close()
    row = await admin_conn.fetchrow(
        "SELECT t.tenant_id, t.state, e.actor_id, e.task_state_version FROM agent_tasks t"
        " JOIN agent_events e ON e.tenant_id = t.tenant_id AND e.task_id = t.id WHERE t.id = $1",
        task_id,
    )
    assert row is not None
    assert (row["tenant_id"], row["state"], row["actor_id"], row["task_state_version"]) == (
        seeded.a,
        "pending",
        AGENT_A,
        0,
    )


async def test_G15_request_task_refuses_an_unscoped_session(db: Database, seeded: Tenants) -> None:
    conn = await db.connect(AGENT_UNPINNED)
    try:
        async with conn.transaction():  # control: scoped, it works
            await conn.execute("SELECT set_config('agentdb.tenant_id', $1, true)", str(seeded.b))
            assert await conn.fetchval("SELECT agentdb_request_task('triage', 'v1')") is not None
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.fetchval("SELECT agentdb_request_task('triage', 'v1')")
        assert refused.value.sqlstate == "AG007"
        assert refused.value.constraint_name == "agentdb_tenant_scope"
    finally:
        await conn.close()


async def test_G15_runtime_policies_span_tenants_but_grant_no_delete(
    db: Database, seeded: Tenants, runtime_conn: asyncpg.Connection, admin_conn: asyncpg.Connection
) -> None:
    for table in TENANT_TABLES:
        await _assert_policy(admin_conn, table, "runtime_all", "agentdb_runtime", "*")
        mine, others = await _visible(runtime_conn, table, seeded.a)
        assert mine > 0, table
        assert others > 0, table
        with pytest.raises(asyncpg.PostgresError) as refused:
            await runtime_conn.execute(
                f"DELETE FROM {table} WHERE false"  # noqa: S608 - table from constant list
            )
        assert refused.value.sqlstate == "42501", table
        # The GRANT refused it (RLS shares the SQLSTATE): the privilege is absent.
        assert not await runtime_conn.fetchval("SELECT has_table_privilege($1, 'DELETE')", table), (
            table
        )
        assert await runtime_conn.fetchval("SELECT has_table_privilege($1, 'SELECT')", table)


async def test_G15_policies_open_nothing_to_other_roles(db: Database, seeded: Tenants) -> None:
    """A role holding SELECT but named in no policy sees no rows (RLS is enabled and forced)."""
    conn = await db.connect(STRANGER)
    try:
        for table in ("agent_tasks", "agent_events"):
            assert await _visible(conn, table, seeded.a) == (0, 0), table
    finally:
        await conn.close()


async def test_G15_every_tenant_table_forces_rls(admin_conn: asyncpg.Connection) -> None:
    rows = await admin_conn.fetch(
        "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class"
        " WHERE relname = ANY($1::text[]) AND relkind IN ('r', 'p')",
        list(TENANT_TABLES),
    )
    assert {r["relname"] for r in rows} == set(TENANT_TABLES)
    assert all(r["relrowsecurity"] and r["relforcerowsecurity"] for r in rows)


# ---- owners without CREATEROLE --------------------------------------------------------

OWNER = "agentdb_test_owner"


async def _owner_round_trip(dsn: str) -> None:
    """As the (non-superuser) owner, write and read a row in every tenant table under FORCE RLS."""
    conn = await asyncpg.connect(dsn)
    try:
        for table in TENANT_TABLES:
            await _assert_policy(conn, table, "owner_all", OWNER, "*")
        tenant = uuid.uuid4()
        await conn.execute("INSERT INTO agent_tenants (id, name) VALUES ($1, 'own')", tenant)
        await _seed(conn, tenant)
        for table in TENANT_TABLES:
            mine, others = await _visible(conn, table, tenant)
            assert mine > 0, table
            assert others == 0, table
    finally:
        await conn.close()


def _privileges(dsn: str, role: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT has_table_privilege(%s, 'agent_tasks', 'UPDATE')"
            " AND has_table_privilege(%s, 'agent_events', 'INSERT')"
            " AND NOT has_table_privilege(%s, 'agent_events', 'UPDATE')",
            (role, role, role),
        ).fetchone()
    return bool(row and row[0])


async def test_G15_owner_without_createrole_uses_existing_roles(
    pg_server: _pg.Server, template_db: str
) -> None:
    with _pg.admin(pg_server.admin_dsn) as conn:
        _pg.ensure_role(conn, OWNER, "NOCREATEROLE")
    with _pg.temp_database(pg_server, owner=OWNER) as name:
        dsn = pg_server.url(name, user=OWNER, password=_pg.TEST_PASSWORD)
        assert migrate.migrate(dsn) == migrate.migration_ids()
        assert _privileges(dsn, "agentdb_runtime")
        await _owner_round_trip(dsn)


@pytest.fixture(scope="module")
def bare_server() -> Iterator[_pg.Server]:
    """A private embedded cluster where the agentdb roles do not exist (yet)."""
    with contextlib.ExitStack() as stack:
        yield _pg.start_embedded(stack)


async def test_G15_owner_without_createrole_and_no_roles_then_grant(
    bare_server: _pg.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with _pg.admin(bare_server.admin_dsn) as conn:
        _pg.ensure_role(conn, OWNER, "NOCREATEROLE")
    with _pg.temp_database(bare_server, owner=OWNER) as name:
        dsn = bare_server.url(name, user=OWNER, password=_pg.TEST_PASSWORD)
        assert migrate.migrate(dsn) == migrate.migration_ids()
        with _pg.admin(bare_server.admin_dsn) as conn:
            missing = conn.execute(
                "SELECT count(*) FROM pg_roles"
                " WHERE rolname IN ('agentdb_runtime', 'agentdb_agent')"
            ).fetchone()
            assert missing == (0,)
        await _owner_round_trip(dsn)  # the schema works for its owner meanwhile

        assert cli(["grant", "--dsn", dsn]) == 0
        assert "agentdb_runtime is missing" in capsys.readouterr().out

        with _pg.admin(bare_server.admin_dsn) as conn:  # the DBA step
            for stmt in migrate.role_ddl().strip().splitlines():
                conn.execute(stmt.encode())
        assert cli(["grant", "--dsn", dsn]) == 0
        assert "missing" not in capsys.readouterr().out
        assert _privileges(dsn, "agentdb_runtime")
        with psycopg.connect(dsn, autocommit=True) as conn:
            policies = conn.execute(
                "SELECT count(*) FROM pg_policy WHERE polname LIKE '%runtime_all'"
                " OR polname LIKE '%agent_scope'"
            ).fetchone()
        # The runtime's policy on each of its 15 tables, the agent's scope on 7.
        assert policies == (22,)


def test_cli_wrong_password_is_one_line(
    bare_server: _pg.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with _pg.admin(bare_server.admin_dsn) as conn:
        _pg.ensure_role(conn, "agentdb_pw_user")
        hba = conn.execute("SHOW hba_file").fetchone()
        assert hba is not None
        path = str(hba[0])
    with open(path, encoding="utf-8") as f:
        original = f.read()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("local all agentdb_pw_user scram-sha-256\n" + original)
        with _pg.admin(bare_server.admin_dsn) as conn:
            conn.execute("SELECT pg_reload_conf()")
        dsn = bare_server.url("postgres", user="agentdb_pw_user", password="wrong")
        assert cli(["status", "--dsn", dsn]) == 1
        err = capsys.readouterr().err
        assert err.startswith("agentdb: cannot connect to ")
        assert err.count("\n") == 1
        assert "wrong" not in err
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
        with _pg.admin(bare_server.admin_dsn) as conn:
            conn.execute("SELECT pg_reload_conf()")


POLICY_NAMES = {
    *(f"{t}_owner_all" for t in TENANT_TABLES),
    *(f"{t}_runtime_all" for t in TENANT_TABLES),
    *(f"{t}_agent_scope" for t in (*AGENT_SCOPED, "agent_tenants")),
    *(f"{t}_operator_scope" for t in (*OPERATOR_SCOPED, "agent_tenants")),
    "agentdb_tenant_scope",
    "agent_signals_agent_send",
}


# The whole privilege story, pinned: any GRANT added or REVOKE dropped fails here.
_TABLE_PRIVILEGES: dict[str, dict[str, str]] = {
    "agentdb_runtime": {
        "agent_tenants": "SELECT",
        "agent_transitions": "SELECT",
        "agent_credential_refs": "SELECT",
        "agent_tasks": "INSERT,SELECT,UPDATE",
        "agent_operations": "INSERT,SELECT,UPDATE",
        "agent_outbox": "INSERT,SELECT,UPDATE",
        "agent_events": "INSERT,SELECT",
        "agent_inbox": "INSERT,SELECT",
        "agent_artifacts": "INSERT,SELECT",
        "agent_concurrency_limits": "INSERT,SELECT,UPDATE",
        "agent_budgets": "INSERT,SELECT,UPDATE",
        "agent_budget_holds": "INSERT,SELECT,UPDATE",
        "agent_rate_limits": "INSERT,SELECT,UPDATE",
        "agent_global_rate_limits": "INSERT,SELECT,UPDATE",
        "agent_signals": "INSERT,SELECT",
        "agent_schedules": "INSERT,SELECT,UPDATE",
        "agent_steps": "INSERT,SELECT,UPDATE",
    },
    "agentdb_agent": {
        "agent_tenants": "SELECT",
        "agent_transitions": "SELECT",
        "agent_tasks": "SELECT",
        "agent_operations": "SELECT",
        "agent_events": "SELECT",
        "agent_artifacts": "SELECT",
        # G22: plain signals to its own tenant's tasks (agent_signals_agent_send), no approvals.
        "agent_signals": "INSERT,SELECT",
        # G25: reads its own tenant's steps; writes none (a step needs the task's lease).
        "agent_steps": "SELECT",
    },
    # 0013.operator: a console's writes - cancel and retry (tasks), settle (operations and
    # their holds), retry a message, approve (signals), each with its event; no INSERT of a
    # task or an operation, no DELETE, no rewrite of an event.
    "agentdb_operator": {
        "agent_tenants": "SELECT",
        "agent_transitions": "SELECT",
        "agent_steps": "SELECT",
        "agent_concurrency_limits": "SELECT",
        "agent_tasks": "SELECT,UPDATE",
        "agent_operations": "SELECT,UPDATE",
        # INSERT: a cancel's task_transition names the table (it writes no message).
        "agent_outbox": "INSERT,SELECT,UPDATE",
        "agent_budgets": "SELECT,UPDATE",
        "agent_budget_holds": "SELECT,UPDATE",
        "agent_events": "INSERT,SELECT",
        "agent_signals": "INSERT,SELECT",
    },
    STRANGER: {"agent_tasks": "SELECT", "agent_events": "SELECT"},  # granted by the test setup
}
# SECURITY DEFINER routines and the owner's tools: who may EXECUTE them (STRANGER,
# a role with no agentdb membership, stands for PUBLIC). Trigger functions and the
# pure secret checks stay executable by PUBLIC: calling them directly does nothing.
_ROUTINES: dict[str, set[str]] = {
    "agentdb_current_tenant": {"agentdb_runtime", "agentdb_agent", "agentdb_operator"},
    "agentdb_request_task": {"agentdb_runtime", "agentdb_agent"},
    "agentdb_delete_tenant": set(),
    "agentdb_grant_roles": set(),
    # G22: trigger functions (definer, so an agent's signal may lock its task); called
    # directly they refuse to run, so PUBLIC keeps EXECUTE like every trigger function.
    "agentdb_guard_signal": {"agentdb_runtime", "agentdb_agent", STRANGER},
    "agentdb_deliver_signal": {"agentdb_runtime", "agentdb_agent", STRANGER},
    "agentdb_guard_signal_cursor": {"agentdb_runtime", "agentdb_agent", STRANGER},
    "agentdb_purge_tasks": set(),
    "agentdb_purge_task_signals": set(),
    # G24: the runtime fires schedules.
    "agentdb_fire_schedule": {"agentdb_runtime"},
    "agentdb_pin_search_paths": set(),
    "agentdb_distribute": set(),
    "agentdb_purge": set(),
    "agentdb_purge_books": set(),
    "agentdb_purge_tenant": set(),
    # G9: the month partitions of agent_events (events by month, opt-in).
    "agentdb_event_partitions": set(),
    # G25, G20: trigger functions (definer, so a step's or a message's writer may lock
    # its task); called directly they refuse to run, like every trigger function.
    "agentdb_guard_step": {"agentdb_runtime", "agentdb_agent", STRANGER},
    "agentdb_guard_outbox_task": {"agentdb_runtime", "agentdb_agent", STRANGER},
}
_PRIVILEGES = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"]


async def test_G15_the_privilege_matrix_is_exactly_the_documented_one(
    admin_conn: asyncpg.Connection,
) -> None:
    rows = await admin_conn.fetch(
        "SELECT r, c.relname, string_agg(priv, ',' ORDER BY priv)"
        " FROM unnest($1::text[]) r, pg_class c, unnest($2::text[]) priv"
        # Partitions too (relkind r): a grant on one would bypass the root's RLS.
        " WHERE c.relname LIKE 'agent\\_%' AND c.relkind IN ('r', 'p')"
        "   AND c.relnamespace = current_schema()::regnamespace"
        "   AND has_table_privilege(r, c.oid, priv)"
        " GROUP BY 1, 2",
        list(_TABLE_PRIVILEGES),
        _PRIVILEGES,
    )
    granted: dict[str, dict[str, str]] = {role: {} for role in _TABLE_PRIVILEGES}
    for role, table, privs in rows:
        granted[role][table] = privs
    assert granted == _TABLE_PRIVILEGES


async def test_G15_only_the_approved_roles_may_execute_the_security_definer_routines(
    admin_conn: asyncpg.Connection,
) -> None:
    roles = ("agentdb_runtime", "agentdb_agent", STRANGER)
    for routine, allowed in _ROUTINES.items():
        allowed = allowed - {"agentdb_operator"}
        oid = await admin_conn.fetchval(
            "SELECT oid FROM pg_proc"
            " WHERE proname = $1 AND pronamespace = current_schema()::regnamespace",
            routine,
        )
        assert oid is not None, routine
        may = {
            role
            for role in roles
            if await admin_conn.fetchval(
                "SELECT has_function_privilege($1, $2::oid, 'EXECUTE')", role, oid
            )
        }
        assert may == allowed, routine
    definers = {
        r[0]
        for r in await admin_conn.fetch(
            "SELECT proname FROM pg_proc WHERE prosecdef AND proname LIKE 'agentdb\\_%'"
        )
    }
    assert definers <= set(_ROUTINES)


async def test_G15_a_role_outside_agentdb_cannot_request_a_task_even_with_a_scope(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    conn = await db.connect(STRANGER)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('agentdb.tenant_id', $1, true)", str(seeded.a))
            with pytest.raises(asyncpg.PostgresError) as refused:
                await conn.fetchval("SELECT agentdb_request_task('triage', 'v1')")
        assert refused.value.sqlstate == "42501"
    finally:
        await conn.close()
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE task_type = 'triage'")
        == 0
    )


async def test_G22_an_agent_sends_plain_signals_to_its_own_tenant_and_never_approves(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """agent_signals_agent_send: own tenant, kind 'signal' only - an agent does not approve."""
    await _assert_policy(admin_conn, "agent_signals", "agent_send", "agentdb_agent", "a")
    own = await admin_conn.fetchval("SELECT id FROM agent_tasks WHERE tenant_id = $1", seeded.a)
    other = await admin_conn.fetchval("SELECT id FROM agent_tasks WHERE tenant_id = $1", seeded.b)
    insert = (
        "INSERT INTO agent_signals (tenant_id, task_id, name, kind, decision, sender)"
        " VALUES ($1, $2, $3, $4, $5, current_user) RETURNING seq"
    )
    conn = await db.connect(AGENT_A)
    try:
        # Control: a plain signal to its own tenant's task is recorded, in order.
        assert await conn.fetchval(insert, seeded.a, own, "nudge", "signal", None) == 2
        for tenant, task_id, kind, decision, refusal in (
            # its own approval: the policy
            (seeded.a, own, "approval", "approved", asyncpg.InsufficientPrivilegeError),
            # another tenant's task: one it cannot see, as if there were none
            (seeded.b, other, "signal", None, asyncpg.ForeignKeyViolationError),
        ):
            # No RETURNING: its read would be refused by agent_signals_agent_scope anyway.
            with pytest.raises(refusal):
                await conn.execute(insert[: insert.index(" RETURNING")], tenant, task_id,
                                   "approval", kind, decision)  # fmt: skip
    finally:
        await conn.close()
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_signals WHERE kind = 'approval'") == 0
    )


async def test_G22_an_agent_learns_nothing_of_another_tenants_task_by_signalling_it(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """agent_signals_access: a task the sender cannot see is refused as if it did not exist
    (23503) - not locked and reported finished (AG012) or late (AG013) by the owner's guard."""
    other = await admin_conn.fetchval("SELECT id FROM agent_tasks WHERE tenant_id = $1", seeded.b)
    finished = await F.create_task(admin_conn, seeded.b)
    await F.update_task(admin_conn, seeded.b, finished, state="cancelled", state_version=1)
    past = datetime.now(UTC) - timedelta(days=1)
    late = await F.create_task(admin_conn, seeded.b, deadline_at=past)
    own_finished = await F.create_task(admin_conn, seeded.a)
    await F.update_task(admin_conn, seeded.a, own_finished, state="cancelled", state_version=1)
    insert = (
        "INSERT INTO agent_signals (tenant_id, task_id, name, sender) VALUES ($1, $2, 'go', 'a')"
    )
    conn = await db.connect(AGENT_A)
    try:
        for task_id in (other, finished, late):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await conn.execute(insert, seeded.b, task_id)
            assert refused.value.sqlstate == "23503", (task_id, refused.value)
        # Control: its own tenant's finished task is one it may know about.
        with pytest.raises(asyncpg.PostgresError) as told:
            await conn.execute(insert, seeded.a, own_finished)
        assert told.value.sqlstate == "AG012", told.value
    finally:
        await conn.close()
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_signals WHERE sender = 'a'") == 0


# ---- the operator's console (0013.operator) -------------------------------------------


async def _scoped(conn: asyncpg.Connection, tenant: uuid.UUID, stmt: str, *args: object) -> None:
    """Run ``stmt`` in a transaction scoped to ``tenant``, as a console does."""
    async with conn.transaction():
        await conn.execute("SELECT agentdb_scope_tenant($1)", tenant)
        await conn.execute(stmt, *args)


async def test_G15_operator_sees_and_writes_only_the_tenant_it_scopes_to(
    db: Database, seeded: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """agentdb_operator: every row of the scoped tenant, none of another, nothing unscoped;
    its writes land in the scoped tenant and nowhere else (attack and control, raw SQL)."""
    await _assert_policy(admin_conn, "agent_tenants", "operator_scope", "agentdb_operator", "r")
    for table in OPERATOR_SCOPED:
        await _assert_policy(admin_conn, table, "operator_scope", "agentdb_operator", "*")
    task_b = await admin_conn.fetchval("SELECT id FROM agent_tasks WHERE tenant_id = $1", seeded.b)
    conn = await db.connect(OPERATOR)
    try:
        for table in (*OPERATOR_SCOPED, "agent_tenants"):
            assert await _visible(conn, table, seeded.a) == (0, 0), table  # no scope: nothing
        async with conn.transaction():
            await conn.execute("SELECT agentdb_scope_tenant($1)", seeded.a)
            for table in (*OPERATOR_SCOPED, "agent_tenants"):
                mine, others = await _visible(conn, table, seeded.a)
                assert (mine > 0, others) == (True, 0), table
            # Attack: another tenant's task is not there to update.
            moved = await conn.execute(
                "UPDATE agent_tasks SET updated_at = now() WHERE tenant_id = $1", seeded.b
            )
            assert moved == "UPDATE 0"
            # Control: its own tenant's are.
            moved = await conn.execute(
                "UPDATE agent_tasks SET updated_at = now() WHERE tenant_id = $1", seeded.a
            )
            assert moved != "UPDATE 0"
        # Attack: an event (or an approval) written into another tenant is refused.
        for stmt, args in (
            (
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version) VALUES ($1, $2, 'x', 'mallory', 'v1')",
                (seeded.b, task_b),
            ),
            (
                "INSERT INTO agent_signals (tenant_id, task_id, name, kind, sender, decision)"
                " VALUES ($1, $2, 'approval', 'approval', 'mallory', 'approved')",
                (seeded.b, task_b),
            ),
        ):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await _scoped(conn, seeded.a, stmt, *args)
            assert refused.value.sqlstate in ("42501", "23503"), stmt
        # No DELETE at all, even in its own tenant.
        with pytest.raises(asyncpg.PostgresError) as refused:
            await _scoped(conn, seeded.a, "DELETE FROM agent_outbox WHERE tenant_id = $1", seeded.a)
        assert refused.value.sqlstate == "42501"
    finally:
        await conn.close()


async def test_G15_a_scope_without_a_tenant_is_refused_as_a_missing_value(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """agentdb_scope_tenant(NULL) is refused with SQLSTATE 22004 - a scope needs a tenant
    id - before it sets anything; with a tenant it scopes the transaction (the control).
    Kills generated ``gen-0001.foundation-agentdb_scope_tenant-raise-1`` (its RAISE removed:
    the SET fails on its own, as a syntax error naming no missing value)."""
    async with admin_conn.transaction():
        with pytest.raises(asyncpg.NullValueNotAllowedError):
            await admin_conn.execute("SELECT agentdb_scope_tenant(NULL)")
    async with admin_conn.transaction():
        await admin_conn.execute("SELECT agentdb_scope_tenant($1)", tenants.a)
        assert await admin_conn.fetchval("SELECT current_setting('agentdb.tenant_id')") == str(
            tenants.a
        )
