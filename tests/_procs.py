"""The processes a test started, found again by a mark in their environment (Linux ``/proc``).

A child inherits its parent's environment and keeps it once its parent is gone
and init has adopted it - when its parent id no longer leads back to the test:
the mark finds every descendant of a command the test ran, however it ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "MARK",
    "gone",
    "marked",
    "marked_env",
    "stop_workers",
    "wait_for_children",
    "worker_processes",
]

MARK = "AGENTDB_TEST_MARK"


def marked_env(mark: str, **extra: str) -> dict[str, str]:
    """The environment for a command whose processes :func:`marked` finds by ``mark``."""
    root = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=root, **{MARK: mark}, **extra)


def marked(mark: str, besides: int = 0) -> list[int]:
    """The live processes carrying ``mark``, but ``besides`` (a zombie's environment is gone)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == besides:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def wait_for_children(proc: subprocess.Popen[str], mark: str, within: float) -> list[int]:
    """Wait until ``proc`` has started a process of its own; ``[]`` if it ended first."""
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:
        children = marked(mark, besides=proc.pid)
        if children:
            return children
        time.sleep(0.05)
    return []


def gone(mark: str, within: float) -> list[int]:
    """Wait for the processes carrying ``mark`` to end; return those left after ``within``."""
    deadline = time.monotonic() + within
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


ROOT = Path(__file__).resolve().parent.parent


def worker_processes(
    dsn: str, handlers: str, n: int, concurrency: int
) -> list[subprocess.Popen[str]]:
    """``n`` ``agentdb worker`` processes on ``handlers`` (MODULE:ATTR), polling fast."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentdb",
                "worker",
                handlers,
                "--dsn",
                dsn,
                "--concurrency",
                str(concurrency),
                "--poll-interval",
                "0.05",
                "--no-listen",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]


def stop_workers(procs: list[subprocess.Popen[str]]) -> list[str]:
    """SIGTERM each worker and wait; their stderr, in order."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    return [p.communicate(timeout=60)[1] for p in procs]
