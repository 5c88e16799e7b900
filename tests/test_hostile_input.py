"""Hostile and malformed input: one line, the documented exit code, nothing written.

The CLI's exit codes: 2 for bad input, 1 for a database or runtime failure, 130
when interrupted. The library raises ConfigurationError for input Postgres or
the driver cannot take - never a raw driver, Unicode or recursion error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentdb import budgets, leases, operations, outbox, schedules, tasks, tenancy
from agentdb.errors import ConfigurationError
from agentdb.models import Message
from tests import _pg
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "AGENTDB_POOLER")}
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args],
        cwd=ROOT, env=dict(base, PYTHONPATH=str(ROOT), **(env or {})),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stderr.startswith("agentdb: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in result.stderr, result.stderr


_BAD_DSNS = [
    ("postgresql://", "names no database"),
    ("postgresql://postgres@[::1/x", "not a valid URL"),
    ("postgresql://postgres@127.0.0.1:5432/postgres?foo=bar", "unknown parameter(s) foo"),
    ("postgresql://postgres@127.0.0.1:notaport/postgres", "not a valid URL"),
    ("mysql://root@localhost/db", "must be a URL such as"),
]
_COMMANDS = [
    ("status",),
    ("purge",),
    ("tenant", "delete", str(uuid.UUID(int=1)), "--dry-run"),
    ("worker", "tests.fixture_handlers:HANDLERS"),
    ("relay", "tests.fixture_handlers:broken_publisher"),
    ("audit",),
]


@pytest.mark.parametrize(("dsn", "fragment"), _BAD_DSNS)
@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
def test_a_malformed_dsn_is_one_line_and_exit_2(
    command: tuple[str, ...], dsn: str, fragment: str
) -> None:
    _one_line(_cli(*command, "--dsn", dsn), 2, fragment)


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
def test_a_refused_port_keeps_its_reason(command: tuple[str, ...]) -> None:
    result = _cli(*command, "--dsn", "postgresql://postgres@127.0.0.1:1/postgres")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "cannot connect to postgresql://postgres@127.0.0.1:1/postgres" in result.stderr
    assert "refused" in result.stderr.lower() or "connect call failed" in result.stderr.lower()


@pytest.mark.parametrize("command", _COMMANDS[:5], ids=lambda c: c[0])
def test_runtime_commands_on_an_unmigrated_database_say_so_and_write_nothing(
    command: tuple[str, ...], pg_server: _pg.Server
) -> None:
    with _pg.temp_database(pg_server) as name:
        dsn = pg_server.url(name)
        result = (
            _cli(*command, "--dsn", dsn, "--no-listen")
            if command[0]
            in (
                "worker",
                "relay",
            )
            else _cli(*command, "--dsn", dsn)
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "run `agentdb migrate` first" in result.stderr
        with _pg.admin(dsn) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            ).fetchone()
        assert tables == (0,)


# ---- the library's inputs ---------------------------------------------------------------

_DEEP: dict[str, Any] = {}
_node = _DEEP
for _ in range(1500):
    _node["a"] = {}
    _node = _node["a"]

_BAD_DOCUMENTS: list[tuple[str, Any]] = [
    ("nul", {"note": "a\x00b"}),
    ("nul-key", {"a\x00": 1}),
    ("lone-surrogate", {"note": "\ud800"}),
    ("deep", _DEEP),
    ("nan", {"x": float("nan")}),
    ("not-json", {"x": object()}),
    # json.dumps would write these keys as text: 1 as "1" (losing "a" to the "1" beside
    # it in jsonb), None as "null", True as "true" - stored under names nobody gave.
    ("int-key", {1: "a", "1": "b"}),
    ("none-key", {None: 1}),
    ("nested-bool-key", {"a": [{"b": {True: 1}}]}),
]


async def _counts(admin: asyncpg.Connection) -> tuple[int, ...]:
    row = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM agent_tasks), (SELECT count(*) FROM agent_operations),"
        " (SELECT count(*) FROM agent_events), (SELECT count(*) FROM agent_outbox)"
    )
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(("label", "doc"), _BAD_DOCUMENTS, ids=[b[0] for b in _BAD_DOCUMENTS])
async def test_documents_postgres_cannot_store_are_refused_before_anything_is_written(
    label: str, doc: Any, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    before = await _counts(admin_conn)
    with pytest.raises(ConfigurationError):
        await tasks.create(pool, tenants.a, "t", params=doc, dedupe_key="k")
    with pytest.raises(ConfigurationError):  # not hashed: the encoding alone refuses it
        await tasks.create(pool, tenants.a, "t", params=doc)
    if not label.startswith("nul"):  # an operation's input is only hashed; a NUL hashes fine
        with pytest.raises(ConfigurationError):
            await operations.reserve(pool, tenants.a, task.id, "k", "send", doc)
    with pytest.raises(ConfigurationError):
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=0, to_state="waiting", payload=doc
        )
    async with pool.acquire() as conn:
        with pytest.raises(ConfigurationError):
            await outbox.enqueue(conn, tenants.a, "t", doc)
    assert await _counts(admin_conn) == before


@pytest.mark.parametrize(
    "text", ["nul\x00inside", "lone \udfff surrogate"], ids=["nul", "lone-surrogate"]
)
async def test_text_postgres_cannot_store_is_refused_and_nothing_is_written(
    text: str, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    before = await _counts(admin_conn)
    with pytest.raises(ConfigurationError):
        await tasks.create(pool, tenants.a, text)
    with pytest.raises(ConfigurationError):
        await operations.reserve(pool, tenants.a, task.id, text, "send", {"x": 1})
    with pytest.raises(ConfigurationError):
        await tenancy.create_tenant(pool, text)
    assert await _counts(admin_conn) == before


@pytest.mark.parametrize("tenant", ["not-a-uuid", 42, b"bytes"], ids=["str", "int", "bytes"])
async def test_a_tenant_id_that_is_not_a_uuid_is_a_configuration_error(
    tenant: Any, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    before = await _counts(admin_conn)
    with pytest.raises(ConfigurationError):
        await tasks.create(pool, tenant, "t")
    with pytest.raises(ConfigurationError):
        await tasks.get(pool, tenant, uuid.uuid4())
    assert await _counts(admin_conn) == before


async def test_a_string_for_task_types_is_refused_not_read_letter_by_letter(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "send_email")
    with pytest.raises(ConfigurationError, match=r"\['send_email'\]"):
        await leases.claim(pool, "w", task_types="send_email")
    with pytest.raises(ConfigurationError):
        await tasks.count_unhandled(pool, "send_email")
    assert await tasks.count_unhandled(pool, ["send_email"]) == []  # control
    [got] = await leases.claim(pool, "w", task_types=["send_email"])  # control
    assert got.task_type == "send_email"


async def test_a_naive_wake_at_is_refused_never_read_in_local_time(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """asyncpg reads a datetime without a time zone in the client machine's zone: noon
    would be 17:00 UTC in New York and noon in London. deadline= and start_at= refused
    it already; wake_at now does on every path."""
    naive, aware = datetime(2030, 1, 1, 12), datetime(2030, 1, 1, 12, tzinfo=UTC)
    with pytest.raises(ConfigurationError, match="no time zone"):
        await tasks.create(pool, tenants.a, "t", wake_at=naive, waiting=True)
    task = await tasks.create(pool, tenants.a, "t", wake_at=aware, waiting=True)  # control
    assert task.wake_at == aware
    with pytest.raises(ConfigurationError, match="no time zone"):
        await tasks.wait_until(pool, task, naive)
    with pytest.raises(ConfigurationError, match="no time zone"):
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=task.state_version,
            to_state="waiting", wake_at=naive,
        )  # fmt: skip
    task = await tasks.wake(pool, task)
    [claimed] = await leases.claim(pool, "w", task_types=["t"])
    assert claimed.lease is not None
    with pytest.raises(ConfigurationError, match="no time zone"):
        await leases.release(pool, claimed.lease, wake_at=naive)
    released = await leases.release(pool, claimed.lease, wake_at=aware)  # control
    assert released.wake_at == aware


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (datetime(2030, 1, 1, 12), "has no time zone"),
        ("2030-01-01T12:00:00+00:00", "must be a datetime, not str"),
        (1893499200, "must be a datetime, not int"),
    ],
    ids=["naive", "text", "epoch"],
)
async def test_every_instant_parameter_refuses_what_is_not_an_aware_datetime(
    pool: asyncpg.Pool, tenants: Tenants, value: Any, match: str
) -> None:
    """deadline=, start_at= and wake_at= alike: a ConfigurationError naming the parameter,
    never an AttributeError from inside agentdb, and nothing written."""
    with pytest.raises(ConfigurationError, match=f"deadline .*{match}|deadline {match}"):
        await tasks.create(pool, tenants.a, "t", deadline=value)
    with pytest.raises(ConfigurationError, match=f"wake_at .*{match}|wake_at {match}"):
        await tasks.create(pool, tenants.a, "t", wake_at=value, waiting=True)
    with pytest.raises(ConfigurationError, match=f"start_at .*{match}|start_at {match}"):
        await schedules.create(pool, tenants.a, "s", "t", every=timedelta(hours=1), start_at=value)
    task = await tasks.create(pool, tenants.a, "t")  # control
    [claimed] = await leases.claim(pool, "w", task_types=["t"])
    assert claimed.lease is not None
    with pytest.raises(ConfigurationError, match=f"wake_at .*{match}|wake_at {match}"):
        await leases.release(pool, claimed.lease, wake_at=value)
    assert await pool.fetchval("SELECT count(*) FROM agent_tasks") == 1
    assert await pool.fetchval("SELECT count(*) FROM agent_schedules") == 0
    assert (await tasks.get(pool, tenants.a, task.id)).state == "running"


async def test_an_outbox_lease_that_has_already_run_out_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Visibility 0 or negative: a second relay could take the message at once."""
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t", {"n": 1})
    for visibility in (timedelta(seconds=-30), timedelta(0)):
        with pytest.raises(ConfigurationError):
            await outbox.claim(pool, "r1", visibility=visibility)
    assert len(await outbox.claim(pool, "r1", visibility=timedelta(seconds=30))) == 1  # control
    assert await outbox.claim(pool, "r2", visibility=timedelta(seconds=30)) == []


@pytest.mark.parametrize("unit", [5, None, b"tokens"], ids=["int", "none", "bytes"])
async def test_a_budget_unit_that_is_not_text_is_a_configuration_error(
    unit: Any, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    with pytest.raises(ConfigurationError):
        await budgets.set_budget(pool, tenants.a, unit, 100)
    await budgets.set_budget(pool, tenants.a, "tokens", 100)  # control


async def test_an_outbox_message_with_no_payload_is_an_empty_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """As outbox.enqueue takes payload=None; it was a raw NOT NULL violation."""
    task = await tasks.create(pool, tenants.a, "t")
    message = Message("t", None)  # type: ignore[arg-type]
    await tasks.transition(
        pool, tenants.a, task.id, expected_version=task.state_version, to_state="pending",
        outbox=[message],
    )  # fmt: skip
    stored = await admin_conn.fetchval("SELECT payload FROM agent_outbox WHERE id = $1", message.id)
    assert stored == "{}"
    # finish_many takes it the same way, and its event keeps its own payload.
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w", task_types=["t"])
    other = Message("t", None)  # type: ignore[arg-type]
    await tasks.finish_many(pool, [claimed], payload={"done": 1}, outbox={claimed.id: [other]})
    stored = await admin_conn.fetchval("SELECT payload FROM agent_outbox WHERE id = $1", other.id)
    assert stored == "{}"
    event = await admin_conn.fetchval(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND to_state = 'succeeded'", claimed.id
    )
    assert event == '{"done": 1}'


# ---- Ctrl-C at any instant ---------------------------------------------------------------


# The installed console script, beside this interpreter (pip puts it there); the
# suite runs in a virtualenv the project was installed into, so it must exist.
SCRIPT = Path(sys.executable).with_name("agentdb")


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3, 0.45])
def test_ctrl_c_early_in_a_command_is_one_line_never_a_traceback(
    delay: float, db: Database
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "status", "--watch", "1", "--dsn", db.admin_dsn],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running 30 s after Ctrl-C at {delay}s: {err!r}") from None
    if proc.returncode == 1 and err.startswith("Could not import runpy module\n"):
        # On a loaded box the signal can land while CPython itself is still starting,
        # before `-m` has run a line of agentdb: CPython prints that and a traceback
        # of its own import, whatever the module. Nothing of agentdb's to check.
        assert err.rstrip().endswith("KeyboardInterrupt"), err
        assert f'File "{ROOT}' not in err, err  # no frame of agentdb's
        return
    assert "Traceback" not in err, err
    # Interrupted before Python could install its handler, the process just ends (-2).
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1] == "agentdb: interrupted", err


# Loaded by the child's interpreter at start-up (``site`` imports ``sitecustomize``
# from its path): when the command imports the module named in the environment,
# the import pauses, says so in a file, and swallows whatever is raised meanwhile -
# as Python itself does with an exception raised in a weakref callback of the import
# lock, which once let `agentdb status --watch` go on after a Ctrl-C, forever.
_SWALLOWING_IMPORT = """
import os, sys, time

class _Swallow:
    def find_spec(self, name, path, target=None):
        if name == os.environ["AGENTDB_SWALLOW_IN"]:
            sys.meta_path.remove(self)
            open(os.environ["AGENTDB_SWALLOW_READY"], "w").close()
            try:
                time.sleep(2)
            except BaseException:
                pass
        return None

sys.meta_path.insert(0, _Swallow())
"""


@pytest.mark.parametrize("module", ["agentdb.tools.cli", "agentdb.tools.status"])
def test_ctrl_c_python_would_swallow_during_an_import_still_ends_the_command(
    module: str, db: Database, tmp_path: Path
) -> None:
    """The interrupt is held until the imports are over, then acts: one line, 130."""
    (tmp_path / "sitecustomize.py").write_text(_SWALLOWING_IMPORT)
    ready = tmp_path / "ready"
    env = dict(
        os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}",
        AGENTDB_SWALLOW_IN=module, AGENTDB_SWALLOW_READY=str(ready),
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "status", "--watch", "1", "--dsn", db.admin_dsn],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never imported the module"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the command went on after a Ctrl-C during an import") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == ["agentdb: interrupted"], err


# Loaded at start-up as above: when the command imports the module named in the
# environment, the process sends itself a Ctrl-C from inside that import - the
# moment CI's loaded box once hit by chance at 0.05 s, inside ``import signal``
# before the entry's hold began, and printed a traceback.
_CTRL_C_IN_IMPORT = """
import os, sys

class _Interrupt:
    def find_spec(self, name, path, target=None):
        if name == os.environ["AGENTDB_CTRL_C_IN"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), 2)  # SIGINT; the signal module is not imported yet
        return None

sys.meta_path.insert(0, _Interrupt())
"""


@pytest.mark.parametrize(
    "module", ["agentdb.tools._entry", "signal", "agentdb.tools.cli", "agentdb.tools.status"]
)
def test_ctrl_c_inside_each_import_of_the_command_s_start_is_one_line(
    module: str, db: Database, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(_CTRL_C_IN_IMPORT)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", AGENTDB_CTRL_C_IN=module)
    proc = subprocess.run(
        [sys.executable, "-m", "agentdb", "status", "--watch", "1", "--dsn", db.admin_dsn],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["agentdb: interrupted"], proc.stderr


# Loaded at start-up as above: the first socket pair the process makes (the event
# loop's self-pipe, made in its constructor) is preceded by a Ctrl-C to itself, so
# the interrupt lands inside the loop's constructor. Unheld, the half-made loop's
# finaliser printed a traceback after the command's line (seen once in CI, at 0.2 s).
_CTRL_C_IN_LOOP_CONSTRUCTOR = """
import os, signal, socket

_real = socket.socketpair

def _socketpair(*args, **kwargs):
    socket.socketpair = _real
    open(os.environ["AGENTDB_CTRL_C_SENT"], "w").close()
    os.kill(os.getpid(), signal.SIGINT)
    return _real(*args, **kwargs)

socket.socketpair = _socketpair
"""


def test_ctrl_c_while_the_event_loop_is_being_made_is_one_line(
    db: Database, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(_CTRL_C_IN_LOOP_CONSTRUCTOR)
    sent = tmp_path / "sent"
    env = dict(
        os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", AGENTDB_CTRL_C_SENT=str(sent)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "agentdb", "status", "--watch", "1", "--dsn", db.admin_dsn],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sent.exists(), "the command made no event loop"
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["agentdb: interrupted"], proc.stderr


def test_ctrl_c_in_the_installed_command_is_one_line(db: Database) -> None:
    """The console script pip writes enters through agentdb.tools._entry, as ``python -m
    agentdb`` does. (pip's own wrapper runs before any handler of ours exists, so the
    instant is chosen after start-up: once the command has printed its first report.)"""
    assert SCRIPT.exists(), f"{SCRIPT} is not installed"
    proc = subprocess.Popen(
        [str(SCRIPT), "status", "--watch", "1", "--json", "--dsn", db.admin_dsn],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first JSON line: the command is running
        assert first.startswith("{"), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "agentdb: interrupted", err


# ---- each layer on its own (the database would also refuse: these say it never gets there) --


@pytest.mark.parametrize("doc", [{"a": "x\x00y"}, {"a": "\ud800"}], ids=["nul", "lone-surrogate"])
def test_documents_are_refused_before_they_are_sent(doc: dict[str, str]) -> None:
    from agentdb._db.jsonb import document

    with pytest.raises(ConfigurationError):
        document(doc, cap=1000, what="payload")
    assert document({"a": "\\u0000 is text"}, cap=1000, what="payload") is not None  # control


def test_a_newline_in_an_argument_still_gives_one_line() -> None:
    result = _cli("migrate", "--no-such-flag\nsecond line")
    _one_line(result, 2, "unrecognized arguments")


async def test_intervals_that_would_spin_are_refused(pool: asyncpg.Pool) -> None:
    from agentdb.relay import Relay
    from agentdb.worker import Worker

    async def handle(job: object) -> None:
        return None

    async def publish(message: object) -> None:
        return None

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigurationError, match="poll_interval"):
            Worker(pool, {"t": handle}, poll_interval=bad)
        with pytest.raises(ConfigurationError, match="retry_cap"):
            Worker(pool, {"t": handle}, retry_cap=bad)
        with pytest.raises(ConfigurationError, match="poll_interval"):
            Relay(pool, publish, poll_interval=bad)
    with pytest.raises(ConfigurationError, match="visibility"):
        Relay(pool, publish, visibility=timedelta(0))
    with pytest.raises(ConfigurationError, match="async callable"):
        Relay(pool, print)  # type: ignore[arg-type]
    Worker(pool, {"t": handle}, poll_interval=0.01)  # control
    Relay(pool, publish, poll_interval=0.01)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        # 10 ms: the worker retook its own task mid-run, ten times in three seconds.
        ("lease_ttl", timedelta(milliseconds=10)),
        ("lease_ttl", timedelta(0)),  # a raw InvariantViolation at the first claim
        ("lease_ttl", timedelta(days=100_000)),  # a crashed worker's task, leased for ages
        ("shutdown_grace", float("nan")),  # stop() never returned
        ("concurrency", 1.5),
        ("concurrency", True),
    ],
)
async def test_worker_settings_out_of_range_are_refused_when_it_is_made(
    setting: str, value: object, pool: asyncpg.Pool
) -> None:
    from agentdb.worker import Worker

    async def handle(job: object) -> None:
        return None

    with pytest.raises(ConfigurationError, match=setting):
        Worker(pool, {"t": handle}, **{setting: value})  # type: ignore[arg-type]
    Worker(pool, {"t": handle}, lease_ttl=timedelta(seconds=1), shutdown_grace=0, concurrency=1)
    Worker(pool, {"t": handle}, lease_ttl=timedelta(days=1))  # controls: the bounds


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (("worker", "tests.fixture_handlers:HANDLERS"), "--poll-interval"),
        (("worker", "tests.fixture_handlers:HANDLERS"), "--retry-cap"),
        (("relay", "tests.fixture_handlers:broken_publisher"), "--poll-interval"),
        (("relay", "tests.fixture_handlers:broken_publisher"), "--visibility"),
    ],
)
def test_cli_intervals_that_would_spin_are_one_line(
    command: tuple[str, ...], flag: str, db: Database
) -> None:
    _one_line(_cli(*command, flag, "0", "--dsn", db.admin_dsn), 2, flag)


@pytest.mark.parametrize("flag", ["--pool-size", "--concurrency"])
def test_cli_a_worker_pool_or_concurrency_below_one_is_one_line(flag: str, db: Database) -> None:
    _one_line(_cli("worker", "tests.fixture_handlers:HANDLERS", flag, "0", "--dsn", db.admin_dsn),
              2, flag)  # fmt: skip
