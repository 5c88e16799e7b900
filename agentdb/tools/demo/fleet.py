"""The demo's processes: what one run asks for (:class:`Workload`) and the supervisor.

Workers and relays are real ``python -m agentdb worker|relay`` processes
running :mod:`agentdb.tools.demo.provider`; the workers are the schedulers
too (each fires due schedules in its maintenance rounds, G24). The supervisor kills them with
SIGKILL from outside at random, and replaces every one that died, whether
killed from outside or by an armed fault point (:mod:`agentdb._faults`),
which also logs the point it fired at.

A process that exits with the command line's usage status (2: a wrong
handler or option) is not replaced: the run stops with that process's last
line, since a new one would fail the same way.

The supervisor reaps every process it started, whatever ends the run: the
fleet is a context manager whose exit SIGTERMs what still runs, SIGKILLs
what is still running :data:`~agentdb.tools.demo.limits.STOP_GRACE` seconds
later and waits for each, within bounds. And each process has the kernel
SIGKILL it when the demo itself dies, so that not even a SIGKILLed demo
leaves its workers behind, holding leases and - behind PgBouncer - the
server connections of a small pool.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, NoReturn

from agentdb.tools.demo.limits import REAP_WAIT, STOP_GRACE

__all__ = [
    "PUBLISHER_TARGET",
    "WORKER_TARGET",
    "Fleet",
    "Workload",
    "kills_by_point",
    "spawn_cli",
]

WORKER_TARGET = "agentdb.tools.demo.provider:WORKER"
PUBLISHER_TARGET = "agentdb.tools.demo.provider:PUBLISHER"

# Each process runs the CLI through this instead of ``-m agentdb``: the same command,
# once it has tied its life to the demo's (_die_with_parent).
_BOOT = "from agentdb.tools.demo.fleet import _child; _child()"
_PARENT = "AGENTDB_DEMO_PARENT"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the demo that started it dies (Linux).

    The demo stops its processes itself on every way out it sees; this is for the
    one it cannot see, its own SIGKILL (an OOM kill, a harness's timeout). The
    kernel watches the thread that forked, here the demo's main thread, which
    lives as long as the demo.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = int(os.environ.get(_PARENT) or 0)
    if parent and os.getppid() != parent:
        os._exit(1)  # the demo died before the line above took effect: nobody to work for


def _child() -> NoReturn:
    """``python -c _BOOT worker|relay ...``: a worker or relay that dies with the demo."""
    _die_with_parent()
    from agentdb.tools.cli import main

    sys.exit(main())


def spawn_cli(
    argv: Sequence[str], env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start ``agentdb <argv>`` as a process that the kernel SIGKILLs when this one dies.

    ``env`` is its whole environment (arm faults with ``AGENTDB_FAULTS`` in it);
    its output is appended to ``log``. The demo, the chaos runs and the testing
    kit's crash matrix (:mod:`agentdb.testing.crash`) start their workers here.

    Raises:
        OSError: the interpreter could not be started.
    """
    return subprocess.Popen(
        [sys.executable, "-c", _BOOT, *argv],
        env={**env, _PARENT: str(os.getpid())},
        stdout=log,
        stderr=log,
    )


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
    timeout: float = 100.0  # seconds for the whole run: connecting, seeding, working, counting
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
        return spawn_cli([*args, "--dsn", self.dsn, "--log-level", "warning"], env, self.log)

    def worker(self) -> subprocess.Popen[bytes]:
        """Start one worker process (with the workload's worker faults armed).

        Its leases last the workload's ``lease_ttl`` whatever the task says: the
        schedules' tasks carry the default (minutes), and a killed worker's must
        come back as soon as an invoice's does.
        """
        ttl = max(1, round(self.workload.lease_ttl.total_seconds()))
        return self._spawn(
            self.workload.worker_faults,
            "worker", WORKER_TARGET, "--concurrency", "4", "--lease-ttl", str(ttl),
            "--poll-interval", "0.2", "--retry-base", "0.05", "--retry-cap", "2",
            "--shutdown-grace", "1",
        )  # fmt: skip

    def relay(self) -> subprocess.Popen[bytes]:
        """Start one relay process (with the workload's relay faults armed)."""
        return self._spawn(
            self.workload.relay_faults,
            "relay", PUBLISHER_TARGET, "--batch", "50", "--visibility", "2",
            "--poll-interval", "0.2", "--retry-base", "0.05",
        )  # fmt: skip

    def start(self) -> None:
        """Start the workload's workers and relays (if one fails to start, stop the others)."""
        try:
            for _ in range(self.workload.workers):
                self.workers.append(self.worker())
            for _ in range(self.workload.relays):
                self.relays.append(self.relay())
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Every process started and not yet reaped."""
        return [p for p in self.workers + self.relays if p.returncode is None]

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL one process, a worker four times out of five (they hold the leases)."""
        group = self.workers if (rng.random() < 0.8 or not self.relays) else self.relays
        victim = group[rng.randrange(len(group))]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            self.external_kills += 1
            # Dead at once unless the kernel holds it; then supervise() reaps it later.
            with contextlib.suppress(subprocess.TimeoutExpired):
                victim.wait(REAP_WAIT)

    def supervise(self) -> None:
        """Replace every process that died (killed from outside or by a fault point).

        Raises:
            ConfigurationError: a process exited with the command line's usage status:
                its handler or options are wrong, so a new one would end
                the same way. The message is that process's last line.
        """
        # Here, not at the top: every process boots through this module (_BOOT).
        from agentdb.errors import ConfigurationError
        from agentdb.tools.cli import EXIT_USAGE

        for kind, group, make in (
            ("worker", self.workers, self.worker),
            ("relay", self.relays, self.relay),
        ):
            for i, proc in enumerate(group):
                if proc.poll() is None:
                    continue
                if proc.returncode == EXIT_USAGE:
                    raise ConfigurationError(
                        f"a {kind} process exited with status {EXIT_USAGE} (not replaced): "
                        f"{self._last_word()}"
                    )
                self.died += 1
                group[i] = make()

    def _last_word(self) -> str:
        """The last ``agentdb:`` line the processes wrote to the log (where the CLI says
        why it exits), or a pointer to the log when there is none."""
        self.log.flush()
        with open(self.log.name, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16_384))
            lines = f.read().decode(errors="replace").splitlines()
        said = [line for line in lines if line.startswith("agentdb: ")]
        return said[-1].removeprefix("agentdb: ") if said else f"see {self.log.name}"

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM every process, SIGKILL those still running ``grace`` seconds later, reap all.

        At most ``grace`` plus :data:`REAP_WAIT` seconds: a worker that waits on the
        database (a statement queued in PgBouncer) does not end on SIGTERM, and a
        process that SIGKILL has not ended by then is the kernel's to end, not ours.
        """
        procs = self.processes()
        for p in procs:
            p.send_signal(signal.SIGTERM)  # a no-op for a process already reaped
        for limit in (grace, REAP_WAIT):
            deadline = time.monotonic() + limit
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.0, deadline - time.monotonic()))
            for p in procs:
                if p.poll() is None:
                    p.kill()


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
