"""Ending a child process the tools started: a signal, a grace period, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

__all__ = ["stop"]


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Send ``sig`` to ``proc`` if it still runs, SIGKILL it ``grace`` seconds later, reap it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
