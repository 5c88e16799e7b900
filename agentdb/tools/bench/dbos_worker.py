"""A DBOS worker process for the bench: ``python -m agentdb.tools.bench.dbos_worker``.

The DBOS side of :mod:`agentdb.tools.bench.versus`, written as the DBOS
documentation writes an application: workflows and steps registered with
decorators, ``DBOS.launch()``, one queue this executor serves
(``worker_concurrency``, polled every ``--poll`` seconds), durability as
shipped. Two workflows, the same units of work as the agentdb handlers
:func:`agentdb.tools.bench.handlers.unit` and :func:`~agentdb.tools.bench.handlers.agent_run`:

* ``unit(tenant, n)``: one external call checkpointed as a ``@DBOS.step``,
  then one notification record (``DBOS.set_event``: a durable key-value
  record a reader fetches with ``get_event``, DBOS's nearest to an outbox row).
* ``agent_run(tenant, n)``: a model step, a tool step, ``DBOS.recv`` for the
  approval the bench driver sends (``DBOSClient.send``), a second tool step,
  and the notification record.

Each process gets its own executor id (DBOS counts ``worker_concurrency`` per
executor); it touches ``--ready`` once it serves the queue and runs until
SIGTERM. dbos is imported only here, in the worker processes, and in the
driver (:mod:`~agentdb.tools.bench.versus`): never by the library.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["APP", "QUEUE", "main"]

#: The DBOS application and queue names the driver enqueues to.
APP = "agentdb-bench"
QUEUE = "bench"


def _compute(v: int) -> int:
    return v * 31 % 1_000_003


def _register() -> None:
    from dbos import DBOS  # type: ignore[import-not-found,unused-ignore]

    @DBOS.step(name="provider")  # type: ignore[untyped-decorator,unused-ignore]
    def provider(n: int) -> dict[str, Any]:
        return {"ok": True, "ref": f"ref-{n}"}  # where the provider call would be

    @DBOS.step(name="model")  # type: ignore[untyped-decorator,unused-ignore]
    def model(n: int) -> int:
        return _compute(n)  # where the model request would be

    @DBOS.step(name="tool")  # type: ignore[untyped-decorator,unused-ignore]
    def tool(v: int) -> dict[str, int]:
        return {"v": v}  # where the tool's provider call would be

    @DBOS.workflow(name="unit")  # type: ignore[untyped-decorator,unused-ignore]
    def unit(tenant: str, n: int) -> None:
        provider(n)
        DBOS.set_event("task.done", {"tenant": tenant, "n": n})

    @DBOS.workflow(name="agent_run")  # type: ignore[untyped-decorator,unused-ignore]
    def agent_run(tenant: str, n: int) -> None:
        v = model(n)
        tool(v)
        DBOS.recv("approval", timeout_seconds=3600)
        tool(_compute(v))
        DBOS.set_event("task.done", {"tenant": tenant, "n": n})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentdb.tools.bench.dbos_worker")
    p.add_argument("--url", required=True, help="the DBOS system database (postgresql://)")
    p.add_argument("--executor", required=True, help="this process's executor id")
    p.add_argument("--concurrency", type=int, default=10, help="the queue's worker_concurrency")
    p.add_argument("--poll", type=float, default=0.05, help="the queue's polling interval, s")
    p.add_argument("--ready", type=Path, required=True, help="a file touched once serving")
    args = p.parse_args(argv)

    from dbos import DBOS  # type: ignore[import-not-found,unused-ignore]

    logging.getLogger("dbos").setLevel(logging.WARNING)
    url = args.url.replace("postgresql://", "postgresql+psycopg://", 1)
    DBOS(
        config={
            "name": APP,
            "system_database_url": url,
            "executor_id": args.executor,
            "log_level": "WARNING",
            # A connection for every workflow running here, and some for DBOS's own threads.
            "sys_db_pool_size": args.concurrency + 10,
        }
    )
    _register()
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=args.concurrency,
        polling_interval_sec=args.poll,
        on_conflict="always_update",
    )
    args.ready.touch()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    DBOS.destroy(destroy_registry=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
