"""Every tool that starts an embedded Postgres leaves nothing behind, however it ends.

Real processes, real signals: each tool runs in a subprocess with its own temp
folder (``TMPDIR``), is signalled once its server is up - or while it is still
starting, the step an interrupt used to cut in half, leaving a server whose
directory was already gone - and must exit with its documented status
(130 after SIGINT, 143 after SIGTERM; 2 for pytest, which ends an interrupted
session so) with no process of that server left (its data directory in the
command line or as the working directory, as every backend has) and no
``agentdb-pg-*`` directory. Normal and error exits of the context manager are
checked in-process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentdb.tools import _signals, embedded
from agentdb.tools.embedded import PREFIX, embedded_postgres

ROOT = Path(__file__).resolve().parent.parent
UP_WITHIN = 120.0  # a loaded box takes its time to initdb
EXIT_WITHIN = 60.0


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short temp folder of the child's own (a Unix socket path has ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="adbt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTDB_TEST")}
    env.pop("AGENTDB_CITUS_DSN", None)
    return dict(env, TMPDIR=str(tmp), PYTHONUNBUFFERED="1")


def _data_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(f"{PREFIX}*"))


def _server_processes(data: Path) -> list[int]:
    """Processes whose command line names ``data`` or whose working directory is in it."""
    where, found = str(data), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            args = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd.startswith(where) or where in args):
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _child(argv: list[str], tmp: Path) -> Iterator[subprocess.Popen[str]]:
    """``argv`` running in ``tmp`` with ``tmp`` as its temp folder (stderr piped); killed
    if still running at the end."""
    proc = subprocess.Popen(
        argv, cwd=tmp, env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _wait_up(proc: subprocess.Popen[str], tmp: Path, *, starting: bool) -> Path:
    """The child's data directory once its server is ready (``starting``: once ``pg_ctl
    start`` has begun, i.e. the server log exists, before the start is over)."""
    deadline = time.monotonic() + UP_WITHIN
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        for data in _data_dirs(tmp):
            if starting and (data / "log").exists():
                return data
            try:
                lines = (data / "postmaster.pid").read_text().split()
            except OSError:
                continue
            if not starting and lines[-1:] == ["ready"] and (data / "log").exists():
                return data
        time.sleep(0.02 if starting else 0.1)
    raise AssertionError(f"no embedded server came up within {UP_WITHIN:g}s")


def _assert_nothing_left(data: Path, tmp: Path) -> None:
    deadline = time.monotonic() + 5  # a SIGKILLed backend may take a moment to go
    while (left := _server_processes(data)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:  # do not leave them to the rest of the suite
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], f"postgres processes of {data} survived"
    assert _data_dirs(tmp) == [], "the data directory survived"


def _signal_run(
    argv: list[str], tmp: Path, sig: signal.Signals, code: int, *, starting: bool = False
) -> str:
    with _child(argv, tmp) as proc:
        data = _wait_up(proc, tmp, starting=starting)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=EXIT_WITHIN)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    _assert_nothing_left(data, tmp)
    return err


_SIGNALS = pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
    ids=["SIGINT", "SIGTERM"],
)
_WHEN = pytest.mark.parametrize("starting", [False, True], ids=["up", "starting"])
_AGENTDB = [sys.executable, "-m", "agentdb"]


@_SIGNALS
@_WHEN
def test_bench_on_its_embedded_server_ended_by_a_signal_leaves_nothing(
    tmp: Path, sig: signal.Signals, code: int, starting: bool
) -> None:
    argv = [*_AGENTDB, "bench", "--quick", "--reps", "1", "--out", str(tmp / "out")]
    _signal_run(argv, tmp, sig, code, starting=starting)


@_SIGNALS
@_WHEN
def test_demo_on_its_embedded_server_ended_by_a_signal_leaves_nothing(
    tmp: Path, sig: signal.Signals, code: int, starting: bool
) -> None:
    argv = [*_AGENTDB, "demo", "--tasks", "300", "--tenants", "2", "--timeout", "200"]
    err = _signal_run(argv, tmp, sig, code, starting=starting)
    assert f"demo stopped by {sig.name}" in err


@_SIGNALS
def test_python_m_bench_ended_by_a_signal_leaves_nothing(
    tmp: Path, sig: signal.Signals, code: int
) -> None:
    argv = [sys.executable, "-m", "agentdb.tools.bench", "--quick", "--out", str(tmp / "out")]
    _signal_run(argv, tmp, sig, code)


@_SIGNALS
def test_a_pytest_session_on_the_kits_embedded_server_ended_by_a_signal_leaves_nothing(
    tmp: Path, sig: signal.Signals, code: int
) -> None:
    """The testing kit's session server: pytest ends an interrupted session (status 2)
    and tears its fixtures down, SIGTERM included."""
    (tmp / "test_waits.py").write_text(
        textwrap.dedent(
            """
            import time

            def test_waits(agentdb_server):
                time.sleep(300)
            """
        )
    )
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_waits.py"]
    with _child(argv, tmp) as proc:
        data = _wait_up(proc, tmp, starting=False)
        time.sleep(0.5)  # into the test's body
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=EXIT_WITHIN)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err
    _assert_nothing_left(data, tmp)


def test_a_second_signal_during_the_cleanup_does_not_cut_it_short(tmp: Path) -> None:
    """Ctrl-C pressed again and again while the server stops: the stop and the removal
    finish, then the process ends as interrupted."""
    script = textwrap.dedent(
        """
        import time
        from agentdb.tools.embedded import embedded_postgres

        with embedded_postgres(migrate=False):
            time.sleep(300)
        """
    )
    with _child([sys.executable, "-c", script], tmp) as proc:
        data = _wait_up(proc, tmp, starting=False)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)  # the first one has reached the cleanup; Ctrl-C again, and again
        deadline = time.monotonic() + EXIT_WITHIN
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.01)
        _, err = proc.communicate(timeout=EXIT_WITHIN)
    assert proc.returncode == -signal.SIGINT, err  # Python's way to end on a KeyboardInterrupt
    assert "KeyboardInterrupt" in err, err
    _assert_nothing_left(data, tmp)


def test_the_context_manager_cleans_up_on_a_normal_exit_and_on_an_error(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with embedded_postgres(migrate=False):
        (data,) = _data_dirs(tmp)
        assert _server_processes(data)
    _assert_nothing_left(data, tmp)
    seen: list[Path] = []

    def fail() -> None:
        with embedded_postgres(migrate=False):
            seen.extend(_data_dirs(tmp))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    (data,) = seen
    _assert_nothing_left(data, tmp)


def test_a_signal_before_the_cleanup_holds_signals_restarts_it_and_still_acts(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second Ctrl-C of the test above, landing in the instants before the cleanup
    holds signals (CI caught it once on a loaded box): the cleanup starts again instead
    of leaving the directory, and the interrupt is raised once it is done. The landing
    is made exact: the cleanup's first attempt to hold signals raises it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    real = _signals.deferred
    cleaning, landed = [False], [0]

    @contextlib.contextmanager
    def hold_after_a_signal() -> Iterator[None]:
        if cleaning[0] and not landed[0]:
            landed[0] += 1
            raise KeyboardInterrupt  # as Python raises it from its SIGINT handler
        with real():
            yield

    monkeypatch.setattr(embedded, "deferred", hold_after_a_signal)
    seen: list[Path] = []

    def run() -> None:
        with embedded_postgres(migrate=False):
            seen.extend(_data_dirs(tmp))
            cleaning[0] = True  # the block ends normally: the interrupt is the only one

    with pytest.raises(KeyboardInterrupt):
        run()
    assert landed == [1]
    (data,) = seen
    _assert_nothing_left(data, tmp)
