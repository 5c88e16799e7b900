"""``agentdb demo``: run one workload with crashes, then print what came of it.

Several worker *processes* run invoice tasks; each task charges a card and
sends an email through a fake provider (latency, refusals, timeouts whose
effect did happen) and finishes with an outbox message. Relay processes
deliver those messages to a fake consumer that deduplicates with the inbox.
Meanwhile worker and relay processes are killed with SIGKILL at random and
restarted. At the end the report counts, from the database alone: effects
the provider executed, duplicate effects (must be 0), repeat requests the
provider answered from its key and how many of them agentdb's ledger does
not justify (must be 0), operations reconciled after crashes, messages
delivered, redeliveries the inbox absorbed, messages lost (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import IO

from agentdb.errors import ConfigurationError
from agentdb.tools.demo.fleet import Workload
from agentdb.tools.demo.workload import Result, run_workload, with_database

__all__ = ["main", "report"]


def report(w: Workload, r: Result) -> int:
    """Print the report of run ``r`` of ``w``; return the exit status (0 for OK)."""
    c = r.counts
    succeeded = r.tasks_by_state.get("succeeded", 0)
    lines = [
        ("tasks completed", f"{succeeded} of {w.tasks}"
         + (f" ({r.tasks_by_state.get('dead', 0)} dead, {r.tasks_by_state.get('failed', 0)} failed)"
            if succeeded < w.tasks else "")),
        ("worker/relay processes killed (SIGKILL)", str(r.kills)),
        ("tasks taken over after a killed worker's lease expired", str(c["reclaimed"])),
        ("provider requests received", f"{c['requests']} ({c['refused']} refused with 503)"),
        ("effects the provider executed", str(c["effects"])),
        ("repeat requests the provider answered from its key",
         f"{c['replayed']} ({c['unjustified_replays']} not justified by an unknown outcome)"),
        ("duplicate effects", str(c["duplicates"])),
        ("operations with an unknown outcome (timeouts, crashes)", str(c["unknown"])),
        ("operations reconciled from the provider's ledger", str(c["reconciled"])),
        ("outbox messages delivered", str(r.outbox_by_state.get("delivered", 0))),
        ("consumer effects applied", str(c["consumed"])),
        ("redeliveries absorbed by the inbox", str(c["redeliveries"])),
        ("messages lost", str(c["lost"])),
        ("tasks stuck", str(r.stuck)),
        ("throughput", f"{succeeded / r.elapsed:.1f} tasks/s over {r.elapsed:.1f}s"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in lines)
    print("\nagentdb demo report")
    for key, value in lines:
        print(f"  {key:<{width}}  {value}")
    # A run that killed nothing proved nothing about crashes.
    ok = r.ok and (r.kills > 0 or w.kill_every == 0)
    verdict = (
        "every effect once, no blind repeat call, every message delivered, nothing lost"
        if ok
        else f"see the worker and relay logs in {r.log_path}"
    )
    print(f"\n{'OK' if ok else 'FAILED'}: {verdict}")
    return 0 if ok else 1


def main(args: argparse.Namespace) -> int:
    """Run the demo (``agentdb demo``); return the exit status.

    Raises:
        ConfigurationError: a count below 1, or no ``--dsn`` and pgserver is not installed.
        DatabaseUnavailable, MigrationError: the database cannot be used.
    """
    if args.tasks < 1 or args.tenants < 1 or args.workers < 1 or args.relays < 1:
        raise ConfigurationError("--tasks, --tenants, --workers and --relays must be at least 1")
    w = Workload(
        tasks=args.tasks, tenants=args.tenants, workers=args.workers, relays=args.relays,
        kill_every=args.kill_every, timeout=args.timeout, seed=args.seed,
    )  # fmt: skip

    def body(dsn: str, log: IO[bytes], log_path: Path) -> int:
        return report(w, asyncio.run(run_workload(dsn, w, log, log_path)))

    return with_database(args.dsn, body)
