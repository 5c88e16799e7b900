"""``agentdb audit`` on schemas nobody here wrote: four real libraries and the article's.

Each library's schema is created at test time from its pinned registry
package (``tests/_peers.py``) in a scratch database, audited, and compared
with a reviewed expectation file (``tests/audit_expectations/<name>.json``):
the table found for each role, the columns that made it a task, the status
of every guarantee, and words the reason must contain. The expectations come
from reading each library's DDL, not from running the audit; ``why`` in each
file says what the reading found.

Then every suggested fix is applied to the schema inside a transaction and
the schema re-audited on the same connection: the fixed guarantee must move
up and no other guarantee down (a not-applicable guarantee may become
applicable: adding an outbox makes consumer deduplication a question).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from agentdb.guarantees import GUARANTEES
from agentdb.tools.audit import api as audit
from agentdb.tools.audit import catalog, columns
from agentdb.tools.audit.detect import detect
from agentdb.tools.audit.verdicts import TENANCY
from tests import _peers, _pg
from tests.conftest import _ROLE_LOCK
from tests.test_audit import ARTICLE_SQL, AUDITOR

EXPECTATIONS: Final = Path(__file__).parent / "audit_expectations"
SCHEMAS: Final = [*_peers.PEERS, "article"]
_RANK: Final = {"missing": 0, "partial": 1, "enforced": 2}


@pytest.fixture(scope="module")
def auditor(pg_server: _pg.Server) -> str:
    with _pg.admin(pg_server.admin_dsn) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
        try:
            _pg.ensure_role(conn, AUDITOR)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_ROLE_LOCK,))
    return AUDITOR


@pytest.fixture(scope="module", params=SCHEMAS)
def peer_db(request: pytest.FixtureRequest, pg_server: _pg.Server) -> Iterator[tuple[str, str]]:
    """(name, database) with the peer's schema created by its own DDL."""
    name: str = request.param
    # Fetched before the database exists: a registry that cannot be reached
    # fails here, with the package named - never a skip.
    if name != "article":
        _peers.fetch(_peers.PEERS[name])
    with _pg.temp_database(pg_server) as dbname:
        if name == "article":
            with _pg.admin(pg_server.url(dbname)) as conn:
                conn.execute(ARTICLE_SQL.encode())  # a static script of the test module
        else:
            _peers.create(_peers.PEERS[name], pg_server.url(dbname))
        yield name, dbname


def _expected(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EXPECTATIONS / f"{name}.json").read_text())
    return doc


def _schema(name: str) -> str:
    return "public" if name == "article" else _peers.PEERS[name].schema


def test_peer_roles_and_verdicts_match_the_reviewed_reading(
    peer_db: tuple[str, str], pg_server: _pg.Server, auditor: str
) -> None:
    name, dbname = peer_db
    want = _expected(name)
    dsn = pg_server.url(dbname, user=auditor, password=_pg.TEST_PASSWORD)
    report = audit.audit(dsn, schema=_schema(name))
    found = {kind: ref.name if ref else None for kind, ref in report.tables.items()}
    assert found == want["tables"], report.render()
    assert _task_columns(dsn, _schema(name)) == want["columns"]
    statuses = report.statuses()
    # The registry may grow (G18...): every guarantee of the file is judged as
    # reviewed, and every guarantee of the registry the file knows is listed.
    assert set(want["statuses"]) <= set(GUARANTEES)
    got = {g: statuses[g] for g in want["statuses"]}
    assert got == want["statuses"], report.render()
    for gid, fragments in want.get("reasons", {}).items():
        f = report.finding(gid)
        text = "\n".join([f.reason, *f.problems, *f.evidence])
        for fragment in fragments:
            assert fragment in text, (gid, fragment, text)
    if want.get("single_tenant"):
        assert sum("single-tenant" in n for n in report.notes) == 1
        assert all(report.finding(g).status == "not_applicable" for g in sorted(TENANCY))


def _task_columns(dsn: str, schema: str) -> dict[str, str | None]:
    """The columns the audit judged the task table by."""
    with catalog.read_only(dsn) as conn:
        cat = catalog.snapshot(conn, schema)
    ctx = detect(cat, {})
    t = ctx.tasks
    if t is None:
        return {}
    lease = columns.lease(cat, t)

    def n(c: catalog.Column | None) -> str | None:
        return c.name if c is not None else None

    return {
        "state": n(columns.state(t)),
        "wake": n(columns.wake(t)),
        "attempts": n(columns.attempts(t)),
        "version": n(columns.version(t)),
        "dedupe_key": n(columns.dedupe_key(t)),
        "lease_owner": n(lease.owner),
        "takeover": lease.takeover,
    }


def test_every_suggested_fix_applies_and_moves_its_guarantee_up(
    peer_db: tuple[str, str], pg_server: _pg.Server, auditor: str
) -> None:
    name, dbname = peer_db
    schema = _schema(name)
    with psycopg.connect(pg_server.url(dbname), autocommit=True) as conn:
        before = _judge_in(conn, schema, None)
        fixed = [f for f in before.findings if f.fix]
        assert fixed, before.render()
        for finding in before.findings:
            if finding.status in ("missing", "partial"):
                assert finding.fix, (name, finding.guarantee)  # every gap comes with a fix
        for finding in fixed:
            after = _judge_in(conn, schema, finding.fix)
            old, new = before.statuses(), after.statuses()
            gid = finding.guarantee
            assert _RANK[new[gid]] > _RANK[old[gid]], (gid, finding.fix, after.render())
            down = {
                g: (old[g], new[g])
                for g in old
                if g != gid
                and old[g] in _RANK
                and new[g] in _RANK
                and _RANK[new[g]] < _RANK[old[g]]
            }
            assert not down, (gid, down, finding.fix)


def _judge_in(conn: psycopg.Connection[Any], schema: str, fix: str | None) -> audit.Report:
    """Apply ``fix`` in a transaction, audit the result as the auditor, roll back."""
    conn.execute("BEGIN")
    try:
        if fix is not None:
            conn.execute(fix.encode())  # the audit's own suggestion, on a scratch database
        conn.execute("SET LOCAL ROLE agentdb_test_auditor")  # AUDITOR
        conn.execute("SET TRANSACTION READ ONLY")
        return audit.judge(catalog.snapshot(conn, schema))
    finally:
        conn.execute("ROLLBACK")
