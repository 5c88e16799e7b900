"""The demo's processes: what one run asks for (:class:`Workload`) and the supervisor.

Workers and relays are real ``python -m agentdb worker|relay`` processes
running :mod:`agentdb.tools.demo.provider`. The supervisor kills them with
SIGKILL from outside at random, and replaces every one that died, whether
killed from outside or by an armed fault point (:mod:`agentdb._faults`),
which also logs the point it fired at.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO

__all__ = ["PUBLISHER_TARGET", "WORKER_TARGET", "Fleet", "Workload", "kills_by_point"]

WORKER_TARGET = "agentdb.tools.demo.provider:WORKER"
PUBLISHER_TARGET = "agentdb.tools.demo.provider:PUBLISHER"


@dataclass(frozen=True)
class Workload:
    """One run: how much work, how many processes, and how they are made to crash."""

    tasks: int = 300
    tenants: int = 5
    workers: int = 4
    relays: int = 2
    kill_every: float = 0.5  # mean seconds between external SIGKILLs; 0 for none
    worker_faults: str = ""  # AGENTDB_FAULTS for worker processes
    relay_faults: str = ""  # AGENTDB_FAULTS for relay processes
    timeout: float = 100.0
    seed: int | None = None
    max_attempts: int = 25
    lease_ttl: timedelta = timedelta(seconds=2)
    progress: bool = True


@dataclass
class Fleet:
    """The worker and relay processes of one run, their output appended to ``log``."""

    dsn: str
    workload: Workload
    log: IO[bytes]
    fault_log: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    external_kills: int = 0
    died: int = 0

    def _spawn(self, faults: str, *args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, DATABASE_URL=self.dsn, AGENTDB_FAULTS=faults)
        env["AGENTDB_FAULTS_LOG"] = str(self.fault_log)
        if self.workload.seed is not None:
            env["AGENTDB_DEMO_SEED"] = str(self.workload.seed)
        return subprocess.Popen(
            [sys.executable, "-m", "agentdb", *args, "--dsn", self.dsn, "--log-level", "warning"],
            env=env,
            stdout=self.log,
            stderr=self.log,
        )

    def worker(self) -> subprocess.Popen[bytes]:
        """Start one worker process (with the workload's worker faults armed)."""
        return self._spawn(
            self.workload.worker_faults,
            "worker", WORKER_TARGET, "--concurrency", "4",
            "--poll-interval", "0.2", "--retry-base", "0.05", "--shutdown-grace", "1",
        )  # fmt: skip

    def relay(self) -> subprocess.Popen[bytes]:
        """Start one relay process (with the workload's relay faults armed)."""
        return self._spawn(
            self.workload.relay_faults,
            "relay", PUBLISHER_TARGET, "--batch", "50", "--visibility", "2",
            "--poll-interval", "0.2", "--retry-base", "0.05",
        )  # fmt: skip

    def start(self) -> None:
        """Start the workload's workers and relays."""
        self.workers = [self.worker() for _ in range(self.workload.workers)]
        self.relays = [self.relay() for _ in range(self.workload.relays)]

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL one process, a worker four times out of five (they hold the leases)."""
        group = self.workers if (rng.random() < 0.8 or not self.relays) else self.relays
        victim = group[rng.randrange(len(group))]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.external_kills += 1

    def supervise(self) -> None:
        """Replace every process that died (killed from outside or by a fault point)."""
        for group, make in ((self.workers, self.worker), (self.relays, self.relay)):
            for i, proc in enumerate(group):
                if proc.poll() is not None:
                    self.died += 1
                    group[i] = make()

    def stop(self) -> None:
        """SIGTERM every process, then SIGKILL those still running after 10 s."""
        procs = self.workers + self.relays
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def kills_by_point(fault_log: Path) -> dict[str, int]:
    """How many processes each fault point killed (the log has one point name per kill).

    Raises:
        OSError: the log exists but cannot be read.
    """
    found: dict[str, int] = {}
    if fault_log.exists():
        for line in fault_log.read_text().split():
            found[line] = found.get(line, 0) + 1
    return found
