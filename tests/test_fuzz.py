"""Fuzzing the two front doors: the CLI's arguments and the helpers' inputs (hypothesis).

Whatever comes in, the answer is one of agentdb's own: the CLI exits with a
documented code and at most one line on stderr; a helper returns, or raises an
``AgentDBError`` - never a raw driver, Unicode or recursion error - and a helper
that raised wrote nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb import operations, outbox, tasks
from agentdb.errors import AgentDBError
from agentdb.tools.cli import main
from tests.conftest import RUNTIME, Database, Tenants

REFUSED = "postgresql://postgres@127.0.0.1:1/postgres"
_WEIRD = st.sampled_from(
    ["", "0", "-1", "nan", "inf", "1e309", "\x00", "☃", "--", "x" * 300, "a:b", ":", "-", "1"]
)
_FLAGS = st.sampled_from(
    [
        "--schema", "--json", "--watch", "--migrations", "--batch", "--older-than", "--only",
        "--roles", "--all", "--count", "--concurrency", "--pool-size", "--lease-ttl",
        "--poll-interval", "--visibility", "--retry-base", "--retry-cap", "--shutdown-grace",
        "--worker-id",
        "--relay-id", "--map", "--fail-on", "--pooler", "--dry-run", "--yes", "--no-listen",
        "--log-format", "--log-level", "--tasks", "--tenants", "--kill-every", "--timeout",
        "--create-schema",
    ]
)  # fmt: skip
_COMMANDS = st.sampled_from(
    [
        ["migrate"], ["rollback"], ["status"], ["purge"], ["grant"], ["audit"], ["sql"],
        ["tenant", "delete"], ["worker"], ["relay"], ["demo"], ["nonsense"],
    ]
)  # fmt: skip


@contextlib.contextmanager
def _isolated_env() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("AGENTDB_POOLER", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    command=_COMMANDS,
    rest=st.lists(st.one_of(_FLAGS, _WEIRD, st.text(max_size=20)), max_size=6),
)
def test_any_command_line_ends_in_a_documented_exit_and_at_most_one_line(
    command: list[str], rest: list[str]
) -> None:
    # Every run carries a DSN nothing listens on, so none can touch a real database
    # (or start an embedded one): the answer always comes from validation or the connect.
    argv = [*command, *rest, "--dsn", REFUSED] if command != ["sql"] else [*command, *rest]
    err = io.StringIO()
    with (
        _isolated_env(),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    assert code in (0, 1, 2, 3), (argv, code, err.getvalue())
    text = err.getvalue()
    if code != 0:
        assert text.count("\n") == 1, (argv, text)
        assert text.startswith("agentdb"), (argv, text)
        assert "Traceback" not in text


# ---- the helpers' inputs -------------------------------------------------------------------

_ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    _ANY_TEXT,
)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)
_DOC = st.one_of(st.dictionaries(_ANY_TEXT, _JSON, max_size=5), _JSON)
_TENANT = st.one_of(st.just("real"), st.text(max_size=10), st.integers(), st.just(uuid.uuid4()))


async def _counts(conn: asyncpg.Connection) -> tuple[int, ...]:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM agent_tasks), (SELECT count(*) FROM agent_operations),"
        " (SELECT count(*) FROM agent_events), (SELECT count(*) FROM agent_outbox)"
    )
    assert row is not None
    return tuple(row)


async def _attempt(
    db: Database, tenant: uuid.UUID, task_id: uuid.UUID, doc: Any, text: str, who: Any
) -> None:
    conn = await db.connect(RUNTIME)
    admin = await db.connect()
    try:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: tasks.create(conn, who, text, params=doc, dedupe_key=text or None),
            lambda: operations.reserve(conn, who, task_id, text or "k", text or "a", doc),
            lambda: tasks.transition(
                conn, who, task_id, expected_version=0, to_state="pending", payload=doc
            ),
            lambda: outbox.enqueue(conn, who, text, doc),
        ]
        for call in calls:
            before = await _counts(admin)
            try:
                await call()
            except AgentDBError:
                assert await _counts(admin) == before, "a refused call wrote something"
    finally:
        await conn.close()
        await admin.close()


# One database for every example on purpose: each call is judged by its own before/after counts.
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(doc=_DOC, text=_ANY_TEXT, tenant=_TENANT)
def test_any_input_to_the_helpers_is_answered_by_agentdb_and_a_refusal_writes_nothing(
    db: Database, tenants: Tenants, doc: Any, text: str, tenant: Any
) -> None:
    async def scenario() -> None:
        admin = await db.connect()
        try:
            task_id = await admin.fetchval(
                "SELECT id FROM agent_tasks WHERE tenant_id = $1 LIMIT 1", tenants.a
            )
            if task_id is None:
                task_id = (await tasks.create(admin, tenants.a, "seed")).id
        finally:
            await admin.close()
        who = tenants.a if tenant == "real" else tenant
        await _attempt(db, tenants.a, task_id, doc, text, who)

    asyncio.run(scenario())
