"""The peers of the task cycle: PgQueuer and Procrastinate running no-op jobs.

Both are optional (``agentdb[bench]``): :class:`Peers` imports what is
installed, and the functions here import a peer only when it is measured.
PgQueuer runs on asyncpg connections from :func:`agentdb._db.connect`;
Procrastinate on its own psycopg pool.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import logging
from typing import Any

from agentdb import _db
from agentdb.tools.bench.harness import Clock, Cycle, Database, Probe, Window

__all__ = [
    "Peers",
    "pgqueuer_install",
    "pgqueuer_run",
    "procrastinate_install",
    "procrastinate_run",
]


class Peers:
    """The optional peers, imported if installed; a missing one is reported, not fatal."""

    def __init__(self) -> None:
        self.missing: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        for name in ("pgqueuer", "procrastinate", "dbos"):
            try:
                importlib.import_module(name)
                self.versions[name] = importlib.metadata.version(name)
            except Exception as exc:  # ImportError, or a broken install
                self.missing[name] = f"{type(exc).__name__}: {exc}"

    def has(self, name: str) -> bool:
        return name not in self.missing


async def pgqueuer_install(db: Database) -> None:
    """Install PgQueuer's schema in ``db``.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`; whatever PgQueuer raises.
    """
    from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.queries import Queries  # type: ignore[import-not-found,unused-ignore]

    conn = await _db.connect(db.url)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def pgqueuer_run(
    db: Database, workers: int, batch: int, n: int, clock: Clock, probe: Probe
) -> tuple[Cycle, Window]:
    """Enqueue ``n`` no-op jobs, run them on ``workers`` queue managers; time the run.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`; whatever PgQueuer raises.
    """
    from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.models import Job  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.qm import QueueManager  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.queries import Queries  # type: ignore[import-not-found,unused-ignore]

    seed = await _db.connect(db.url)
    conns = [await _db.connect(db.url) for _ in range(workers)]
    try:
        payloads: list[bytes | None] = [None] * n
        await Queries(AsyncpgDriver(seed)).enqueue(["noop"] * n, payloads, [0] * n)
        await seed.execute("ANALYZE")  # as for agentdb: fresh statistics before the run
        done = Cycle(0)
        managers: list[Any] = []

        async def noop(job: Job) -> None:
            clock.mark()
            done.done += 1
            if done.done >= n:
                # Every job ran: stop; run() returns once the batched
                # completion log is flushed (committed).
                for qm in managers:
                    qm.shutdown.set()

        for c in conns:
            qm = QueueManager(Queries(AsyncpgDriver(c)))
            qm.entrypoint("noop", accepts_context=False)(noop)
            managers.append(qm)
        _, window = await probe.timed(
            db.name, lambda: asyncio.gather(*(qm.run(batch_size=batch) for qm in managers))
        )
        return done, window
    finally:
        for c in (seed, *conns):
            await c.close()


def _quiet_procrastinate() -> None:
    # Procrastinate warns when its App is created in ``__main__`` (workers in
    # other processes could not import the tasks); these workers run here.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)


async def procrastinate_install(db: Database) -> None:
    """Apply Procrastinate's schema to ``db``.

    Raises:
        whatever Procrastinate raises (it connects with psycopg).
    """
    import procrastinate  # type: ignore[import-not-found,unused-ignore]

    _quiet_procrastinate()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=db.url))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_run(
    db: Database, workers: int, n: int, clock: Clock, probe: Probe
) -> tuple[Cycle, Window]:
    """Defer ``n`` no-op jobs, run ``workers`` workers of concurrency 1 until done; time them.

    Raises:
        DatabaseUnavailable: as for :func:`agentdb._db.connect`; whatever Procrastinate raises.
    """
    import procrastinate  # type: ignore[import-not-found,unused-ignore]

    _quiet_procrastinate()
    connector = procrastinate.PsycopgConnector(
        conninfo=db.url, min_size=workers + 1, max_size=workers + 1
    )
    app = procrastinate.App(connector=connector)
    done = Cycle(0)

    @app.task(name="noop", queue="bench")
    async def noop() -> None:
        clock.mark()
        done.done += 1

    async with app.open_async():
        await noop.batch_defer_async(*({} for _ in range(n)))
        analyze = await _db.connect(db.url)  # as for agentdb: fresh statistics
        try:
            await analyze.execute("ANALYZE")
        finally:
            await analyze.close()
        _, window = await probe.timed(
            db.name,
            lambda: asyncio.gather(
                *(
                    app.run_worker_async(
                        queues=["bench"],
                        concurrency=1,
                        wait=False,
                        listen_notify=False,
                        install_signal_handlers=False,
                        name=f"w{i}",
                    )
                    for i in range(workers)
                )
            ),
        )
    return done, window
