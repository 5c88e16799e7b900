"""Where the testing kit gets its PostgreSQL: a server, a migrated template, a clone per test.

The server is ``$AGENTDB_TEST_DSN`` when set (a role that may CREATE DATABASE),
else an embedded PostgreSQL (``pgserver``: binaries from a wheel) started in a
temporary directory. The template is migrated once; each test gets a copy
(``CREATE DATABASE ... TEMPLATE``), which takes milliseconds, and it is
dropped afterwards.

Everything here is synchronous and hands out plain strings and frozen
objects, so session-scoped fixtures never hold something bound to an event
loop.

With ``AGENTDB_TEST_ON_CITUS=1`` the server is the Citus coordinator named by
``AGENTDB_CITUS_DSN`` (citus installed, workers added). A test database then
exists on the coordinator and on every worker under one name (Citus reaches
a worker's shards in the database of the same name): it is created, cloned
and dropped node by node, and the template is migrated with ``--citus``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from agentdb.tools._common import CITUS_ENV, ON_CITUS_ENV

__all__ = [
    "CITUS_ENV",
    "EVENTS_BY_MONTH",
    "EVENTS_BY_MONTH_ENV",
    "ON_CITUS",
    "ON_CITUS_ENV",
    "ROLE_LOCK",
    "Clones",
    "Database",
    "Server",
    "admin",
    "clones",
    "create_database",
    "drop_database",
    "migrated_template",
    "provision",
    "temp_database",
    "with_db",
]

#: A cluster-wide advisory lock: migrations create agentdb's roles, which are
#: cluster-wide, and two test sessions on one server must not race on CREATE ROLE.
ROLE_LOCK = 0x61_67_65_6E_74_64_62

#: The session runs on Citus (see the module's docstring).
ON_CITUS = os.environ.get(ON_CITUS_ENV, "") not in ("", "0")
#: Set (make test-events-by-month): the template's agent_events is partitioned by month.
EVENTS_BY_MONTH_ENV = "AGENTDB_TEST_EVENTS_BY_MONTH"
EVENTS_BY_MONTH = os.environ.get(EVENTS_BY_MONTH_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server the tests may create databases (and roles) on."""

    admin_dsn: str
    source: str
    #: Citus: the workers' admin DSNs (the same login, their own host and port).
    workers: tuple[str, ...] = ()

    @property
    def citus(self) -> bool:
        return bool(self.workers)

    def nodes(self) -> tuple[str, ...]:
        """The admin DSN of every node a database of this server lives on, coordinator first."""
        return (self.admin_dsn, *self.workers)

    def url(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        """This server's DSN for database ``dbname`` (as the admin, or as ``user``)."""
        return with_db(self.admin_dsn, dbname, user=user, password=password)


@dataclass(frozen=True)
class Database:
    """One migrated database for one test (``dsn`` logs in as the server's admin)."""

    server: Server
    name: str

    @property
    def dsn(self) -> str:
        return self.server.url(self.name)

    @property
    def admin_dsn(self) -> str:
        return self.dsn

    def url(self, user: str, password: str | None = None) -> str:
        """This database's DSN for the login ``user``."""
        return self.server.url(self.name, user=user, password=password)


def with_db(dsn: str, dbname: str, *, user: str | None = None, password: str | None = None) -> str:
    """Return ``dsn`` pointed at another database and, optionally, another login."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if user is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}:{password}@{host}" if password else f"{user}@{host}"
    return urlunsplit((parts.scheme, netloc, f"/{dbname}", parts.query, parts.fragment))


def admin(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection (CREATE DATABASE cannot run in a transaction).

    Raises:
        psycopg.OperationalError: the server cannot be reached.
    """
    return psycopg.connect(dsn, autocommit=True)


def at_node(dsn: str, host: str, port: int) -> str:
    """``dsn`` with its host and port replaced (the same login and database)."""
    parts = urlsplit(dsn)
    creds = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit((parts.scheme, f"{creds}{host}:{port}", parts.path, parts.query, ""))


def _citus() -> Server:
    dsn = os.environ.get(CITUS_ENV)
    if not dsn:
        raise RuntimeError(
            f"{ON_CITUS_ENV} is set but {CITUS_ENV} is not: point it at a database on a "
            "Citus coordinator (citus installed, workers added)"
        )
    try:
        with admin(dsn) as conn:
            rows = conn.execute(
                "SELECT node_name, node_port FROM citus_get_active_worker_nodes() ORDER BY 1, 2"
            ).fetchall()
    except psycopg.Error as exc:
        raise RuntimeError(f"{CITUS_ENV} is not a reachable Citus coordinator: {exc}") from exc
    if not rows:
        raise RuntimeError(f"{CITUS_ENV}: no active Citus workers are registered there")
    return Server(dsn, "citus", tuple(at_node(dsn, str(h), int(p)) for h, p in rows))


def provision(stack: contextlib.ExitStack) -> Server:
    """``$AGENTDB_TEST_DSN`` if set, else an embedded PostgreSQL that ``stack`` stops
    (with ``AGENTDB_TEST_ON_CITUS=1``: the Citus coordinator ``$AGENTDB_CITUS_DSN``).

    Raises:
        RuntimeError: the DSN cannot be reached, or there is no DSN and the
            embedded server cannot start (pgserver missing) - saying how to provide one.
    """
    if ON_CITUS:
        return _citus()
    dsn = os.environ.get("AGENTDB_TEST_DSN")
    if dsn:
        try:
            with admin(dsn):  # fail now, with the reason, if it cannot be reached
                pass
        except psycopg.Error as exc:
            raise RuntimeError(f"AGENTDB_TEST_DSN cannot be reached: {exc}") from exc
        return Server(dsn, "AGENTDB_TEST_DSN")
    from agentdb.errors import ConfigurationError
    from agentdb.tools.embedded import embedded_postgres

    try:
        return Server(stack.enter_context(embedded_postgres(migrate=False)), "embedded")
    except ConfigurationError as exc:
        raise RuntimeError(
            "no PostgreSQL for the tests: set AGENTDB_TEST_DSN=postgresql://user@host/postgres "
            "(a role that may CREATE DATABASE) or pip install 'agentdb-pg[testing]' for the "
            f"embedded server ({exc})"
        ) from exc


def create_database(
    server: Server, *, template: str | None = None, owner: str | None = None
) -> str:
    """Create a database with a fresh name (a copy of ``template`` when given, owned by
    ``owner`` when given); return its name. On Citus: on every node, one cluster.

    Raises:
        psycopg.Error: the server refused (e.g. the template is in use by a session).
    """
    name = f"agentdb_t_{uuid.uuid4().hex[:12]}"
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        _seal(server, template)
    if owner is not None:
        stmt += sql.SQL(" OWNER {}").format(sql.Identifier(owner))
    created: list[str] = []

    def make(node: str) -> None:
        with admin(_maintenance(server, node)) as conn:
            for attempt in range(_IN_USE_RETRIES):
                try:
                    conn.execute(stmt)
                    break
                except psycopg.errors.ObjectInUse:
                    # A sealed Citus template can still be caught in use: a session of
                    # Citus's own daemons that was already past the connection check
                    # when the template was sealed. It is ended, and the copy tried again.
                    if template is None or not server.citus or attempt + 1 == _IN_USE_RETRIES:
                        raise
                    conn.execute(_TERMINATE, (template,))
                    time.sleep(0.1 * (attempt + 1))
        created.append(node)

    try:
        _on_every_node(server, make)
        if server.citus and template is None:
            _join_cluster(server, name)
        elif server.citus and template is not None:
            _allow_connections(server, name, True)  # the sealed template's clone may be used
            _copy_settings(server, template, name)
    except BaseException:
        _drop(server, created, name)
        raise
    return name


_IN_USE_RETRIES = 5
_TERMINATE = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"


def drop_database(server: Server, name: str) -> None:
    """Drop ``name``, ending its sessions (a test's leftover connections included)."""
    _drop(server, list(server.nodes()), name)


def _maintenance(server: Server, node: str) -> str:
    """Where to run CREATE/DROP DATABASE on ``node``: on Citus, a database without
    the extension (so nothing is propagated behind our back); else the admin DSN."""
    return with_db(node, "postgres") if server.citus else node


def _on_every_node(server: Server, step: Callable[[str], None], nodes: Sequence[str] = ()) -> None:
    """``step(node)`` for each node (default: all of the server's), the nodes at once.

    Copying a Citus template takes seconds a node; the nodes copy side by side.

    Raises:
        the first error a step raised (after every step has ended).
    """
    todo = list(nodes or server.nodes())
    if len(todo) == 1:
        step(todo[0])
        return
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        for future in [pool.submit(step, node) for node in todo]:
            future.result()


def _drop(server: Server, nodes: list[str], name: str) -> None:
    stmt = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))

    def drop(node: str) -> None:
        with admin(_maintenance(server, node)) as conn:
            for attempt in range(_IN_USE_RETRIES):
                try:
                    conn.execute(stmt)
                    return
                except psycopg.errors.ObjectInUse:
                    # FORCE ends the sessions it finds, but on Citus a node's own
                    # connections (its daemon's, the other nodes') can still be there
                    # or back when it looks again: another try, a moment later.
                    if attempt + 1 == _IN_USE_RETRIES:
                        raise
                    time.sleep(0.2 * (attempt + 1))

    if nodes:
        _on_every_node(server, drop, nodes)


def _join_cluster(server: Server, name: str) -> None:
    """Make the new database ``name`` one Citus cluster: the extension everywhere, workers added."""
    for node in server.nodes():
        with admin(with_db(node, name)) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
    coord = urlsplit(server.admin_dsn)
    with admin(with_db(server.admin_dsn, name)) as conn:
        conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (coord.hostname, coord.port))
        for worker in server.workers:
            parts = urlsplit(worker)
            conn.execute("SELECT citus_add_node(%s, %s)", (parts.hostname, parts.port))


#: The advisory lock namespace (the two-int4 form, apart from ROLE_LOCK's bigint keys) of
#: the catalog updates of one database: the second key is ``hashtext`` of its name.
_CATALOG_LOCK = 0x61_67_64_62
_LOCK_CATALOG = "SELECT pg_advisory_lock(%s, hashtext(%s))"
_UNLOCK_CATALOG = "SELECT pg_advisory_unlock(%s, hashtext(%s))"
_ALLOWS = "SELECT datallowconn FROM pg_database WHERE datname = %s"

_guard = threading.Lock()
#: This process's locks: ("catalog", node, database) serialises the updates of a
#: database's pg_database row on a node, ("seal", server, template) the sealing of a
#: template (taken first, then the catalog ones: distinct keys, as they do not re-enter).
_locks: dict[tuple[str, str, str], threading.Lock] = {}


def _lock(kind: str, where: str, name: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault((kind, where, name), threading.Lock())


def _allow_connections(server: Server, name: str, allow: bool) -> None:
    """ALTER DATABASE ``name`` WITH ALLOW_CONNECTIONS ``allow`` on every node (and, to
    forbid them, end the sessions already there), one such update of ``name`` at a time.

    ALTER DATABASE rewrites the database's pg_database row without locking the
    database: two sessions doing it at once make the second fail with "tuple
    concurrently updated" (XX000). It happened: every Clones thread's first copy
    seals the template. So the updates of one database's row are serialised - in
    this process by a lock, across processes (pytest-xdist workers, test sessions
    sharing a server) by an advisory lock - and an ALTER that would change nothing
    is not sent at all. Advisory locks belong to a database: the one taken here is
    shared by the sessions that share the node's maintenance database (on Citus
    always ``postgres``; else the admin DSN's, which test sessions on one server
    normally share).
    """
    for node in server.nodes():
        # Connected before the lock is taken: the lock is held for the catalog work only.
        with admin(_maintenance(server, node)) as conn, _lock("catalog", node, name):
            # Not released on an error: the connection is closed then, and the lock with it.
            conn.execute(_LOCK_CATALOG, (_CATALOG_LOCK, name))
            row = conn.execute(_ALLOWS, (name,)).fetchone()
            if row is None or row[0] != allow:  # no such database: the ALTER says so
                conn.execute(
                    sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                        sql.Identifier(name), sql.Literal(allow)
                    )
                )
            conn.execute(_UNLOCK_CATALOG, (_CATALOG_LOCK, name))
            if not allow:
                # Even when another session had already forbidden them: the sessions
                # that were there, Citus's daemon's among them, must be gone.
                conn.execute(_TERMINATE, (name,))


def _copy_settings(server: Server, template: str, name: str) -> None:
    """Give the clone the template's database defaults (CREATE DATABASE does not copy them):
    on Citus, ``agentdb migrate --citus`` sets two there (see agentdb._citus.migrate)."""
    with admin(_maintenance(server, server.admin_dsn)) as conn:
        rows = conn.execute(
            "SELECT unnest(s.setconfig) FROM pg_db_role_setting s"
            " JOIN pg_database d ON d.oid = s.setdatabase"
            " WHERE d.datname = %s AND s.setrole = 0",
            (template,),
        ).fetchall()
        for (setting,) in rows:
            key, _, value = setting.partition("=")
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(*key.split(".")), sql.Literal(value)
                )
            )


#: (server, template) pairs this process has sealed; updated under the pair's seal _lock.
_sealed: set[tuple[str, str]] = set()


def _seal(server: Server, template: str) -> None:
    """On Citus, close and forbid every session of ``template`` before the first clone.

    Citus keeps sessions open in each database it knows (its maintenance
    daemon on the coordinator, the daemon's cached connections on the
    workers) and CREATE DATABASE ... TEMPLATE refuses a template in use.
    Once sealed the template is only cloned, never changed.
    """
    if not server.citus:
        return
    key = (server.admin_dsn, template)
    # Every Clones thread's first copy comes here at once: one seals, the others wait
    # until it is sealed (none may copy it before), and then find it done.
    with _lock("seal", server.admin_dsn, template):
        if key not in _sealed:
            _allow_connections(server, template, False)
            _sealed.add(key)


@contextlib.contextmanager
def temp_database(
    server: Server, *, template: str | None = None, owner: str | None = None
) -> Iterator[str]:
    """A database (see :func:`create_database`) dropped when the block ends."""
    name = create_database(server, template=template, owner=owner)
    try:
        yield name
    finally:
        drop_database(server, name)


class Clones:
    """Copies of one template for one test each, made ahead and dropped behind.

    A copy takes a CREATE DATABASE (20-350 ms on the 2-core development
    machine, seconds on Citus) and a DROP; with a copy per test, that was most
    of a short test's time. Background threads make the next tests' copies
    (``ahead`` of them) while a test runs and drop the last ones' meanwhile.
    Only the template's state when a copy is made counts: a template is
    migrated once and then only copied (on Citus it is sealed: see ``_seal``).
    :meth:`close` drops the spare copies and waits for every drop.
    """

    def __init__(self, server: Server, template: str, ahead: int = 4) -> None:
        if ahead < 1:
            raise ValueError("ahead must be at least 1")
        self._server = server
        self._template = template
        self._threads = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="agentdb-clones")
        self._made = collections.deque(self._threads.submit(self._copy) for _ in range(ahead))
        self._drops: list[Future[None]] = []

    def _copy(self) -> str:
        return create_database(self._server, template=self._template)

    def take(self) -> str:
        """A fresh copy of the template (one made ahead), and start the next.

        Raises:
            psycopg.Error: the copy could not be made (the server's error), or
                an earlier copy could not be dropped.
        """
        for done in [d for d in self._drops if d.done()]:
            self._drops.remove(done)
            done.result()
        made = self._made.popleft()
        self._made.append(self._threads.submit(self._copy))
        try:
            return made.result()
        except psycopg.Error:
            # Made while another test ran, so perhaps while it was connected to the
            # template (CREATE DATABASE waits 5 s for that to end): once more, now.
            return self._copy()

    def give_back(self, name: str) -> None:
        """Drop ``name`` (a copy :meth:`take` gave out) in the background."""
        self._drops.append(self._threads.submit(drop_database, self._server, name))

    def close(self) -> None:
        """Drop the spare copies and wait for every drop to end.

        Raises:
            psycopg.Error: a copy could not be dropped (the first such error).
        """
        try:
            while self._made:
                made = self._made.popleft()
                with contextlib.suppress(psycopg.Error):  # a failed copy is nothing to drop
                    self.give_back(made.result())
            for drop in self._drops:
                drop.result()
        finally:
            self._threads.shutdown(wait=True)


@contextlib.contextmanager
def clones(server: Server, template: str) -> Iterator[Clones]:
    """:class:`Clones` of ``template``, closed when the block ends."""
    made = Clones(server, template)
    try:
        yield made
    finally:
        made.close()


@contextlib.contextmanager
def migrated_template(server: Server) -> Iterator[str]:
    """A database with agentdb's migrations and the recording provider's tables, for cloning.

    Raises:
        MigrationError: the migrations failed.
    """
    from agentdb import migrate
    from agentdb.testing.provider import INSTALL

    with temp_database(server) as name:
        if server.citus:
            # Few shards (still on every worker): each test copies the template
            # on every node, and a shard is a table, indexes and triggers each.
            with admin(_maintenance(server, server.admin_dsn)) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET citus.shard_count = 4").format(
                        sql.Identifier(name)
                    )
                )
        with admin(server.admin_dsn) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (ROLE_LOCK,))
            try:
                migrate.migrate(
                    server.url(name), citus=server.citus, events_by_month=EVENTS_BY_MONTH
                )
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (ROLE_LOCK,))
        with admin(server.url(name)) as conn:
            for statement in INSTALL:
                conn.execute(statement)
        yield name
