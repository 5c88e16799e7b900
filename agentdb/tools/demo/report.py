"""``agentdb demo``: run one workload with crashes, then print what came of it.

Several worker *processes* run invoice tasks; each task prices its line
items in child tasks (fan-out, fan-in), waits for a reviewer's approval when
it is large, charges a card and sends an email through a fake provider
(latency, refusals, timeouts whose effect did happen) and finishes with an
outbox message; a share of them is cancelled along the way, and each tenant
has a schedule ticking every second. Relay processes
deliver those messages to a fake consumer that deduplicates with the inbox.
Meanwhile worker and relay processes are killed with SIGKILL at random and
restarted. At the end the report counts, from the database alone: effects
the provider executed, duplicate effects (must be 0), repeat requests the
provider answered from its key and how many of them agentdb's ledger does
not justify (must be 0), operations reconciled after crashes, messages
delivered, redeliveries the inbox absorbed, messages lost (must be 0), and
approvals recorded and read once, signals lost, parents woken twice or never,
effects after a cancel, ticks missed or doubled (all must be 0).

``--timeout`` holds the whole run, and SIGTERM or SIGINT end it early
(:mod:`agentdb.tools.demo.limits`): then there is no report, the processes
are stopped, and one line says where the run was and what it left
unfinished - exit status 1 for the timeout, 128 + the signal's number for a
signal.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import IO

from agentdb.errors import ConfigurationError
from agentdb.tools._signals import run_async
from agentdb.tools.demo.command import CITUS_KILL_EVERY, KILL_EVERY
from agentdb.tools.demo.fleet import Workload
from agentdb.tools.demo.limits import DemoStopped, Limits
from agentdb.tools.demo.workload import Result, run_workload, with_database

__all__ = ["main", "report"]


def _flows(c: dict[str, int]) -> list[tuple[str, str]]:
    """The report's lines for the approvals, fan-outs, cancels and schedules."""
    return [
        ("invoices reviewed (G22)",
         f"{c['approved']} approved, {c['rejected']} rejected ({c['reviews_twice']} reviews"
         f" sent twice; {c['approvals_miscounted']} not recorded exactly once)"),
        ("approvals taken once by their review step (G25)",
         f"{c['approvals_read']} ({c['signals_read_twice']} handed to a run as another)"),
        ("signals lost", str(c["lost_signals"])),
        ("charges without an approval", str(c["unapproved_charges"])),
        ("model steps recorded once, replayed after (G25)",
         f"{c['model_steps']} steps, {c['model_calls']} model calls ({c['model_again']} again"
         f" after a crash mid-step, {c['model_after_record']} after being recorded)"),
        ("line items priced by child tasks (G23)",
         f"{c['children']} for {c['parents']} invoices ({c['fan_in_wrong']} wrong totals)"),
        ("parents woken by their last child",
         f"{c['parents_woken']} ({c['double_wakes']} double wakes, {c['lost_wakes']} never woken)"),
        ("cancels honoured (G20)",
         f"{c['cancelled']} of {c['cancels']} ({c['cancelled_pending']} pending,"
         f" {c['cancelled_running']} running, {c['cancelled_waiting']} waiting;"
         f" {c['cancels_late']} had finished)"),
        ("effects after a cancel",
         f"{c['after_cancel']} ({c['in_flight_at_cancel']} in flight: granted before it,"
         " landed after)"),
        ("schedule ticks, one task each (G24)",
         f"{c['ticks']} ticks of {c['schedules']} schedules"
         f" ({c['ticks_missed']} missed, {c['ticks_doubled']} twice)"),
    ]  # fmt: skip


def report(w: Workload, r: Result) -> int:
    """Print the report of run ``r`` of ``w``; return the exit status (0 for OK)."""
    c = r.counts
    succeeded = r.tasks_by_state.get("succeeded", 0)
    stopped = c["budget_stopped"]
    rejected = c["rejected_failed"]
    cancelled = r.tasks_by_state.get("cancelled", 0)
    failed = r.tasks_by_state.get("failed", 0) - stopped - rejected
    # Completed: ended as the workload meant - paid, rejected by the reviewer, or cancelled.
    completed = succeeded + rejected + cancelled
    lines = [
        ("tasks completed", f"{completed} of {w.tasks}"
         + (f" ({r.tasks_by_state.get('dead', 0)} dead, {failed} failed, {stopped} stopped by "
            "a budget)" if completed < w.tasks else "")),
        ("of which paid, rejected, cancelled",
         f"{succeeded} paid, {rejected} rejected, {cancelled} cancelled"),
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
        ("budget of the first tenant (usd_cents, G19)",
         f"spent {c['budget_spent']} + held {c['budget_held']} of {c['budget_limit']}"),
        ("reservations the budget refused", f"{c['budget_refused']} ({stopped} tasks stopped)"),
        ("overspent", f"{c['overspent']} (charges paid for: {c['budget_charged']})"),
        *_flows(c),
        ("throughput", f"{succeeded / r.elapsed:.1f} tasks/s over {r.elapsed:.1f}s"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in lines)
    print("\nagentdb demo report")
    for key, value in lines:
        print(f"  {key:<{width}}  {value}")
    # A run that killed nothing proved nothing about crashes.
    ok = r.ok and (r.kills > 0 or w.kill_every == 0)
    verdict = (
        "every effect once, no blind repeat call, every message delivered, nothing lost, "
        "no budget overspent, every approval read once, every parent woken once, "
        "nothing after a cancel"
        if ok
        else f"see the worker and relay logs in {r.log_path}"
    )
    print(f"\n{'OK' if ok else 'FAILED'}: {verdict}")
    return 0 if ok else 1


def _distributed(dsn: str) -> bool:
    """Whether ``dsn``'s (migrated) schema is distributed by Citus."""
    import psycopg

    from agentdb.migrate import libpq_dsn

    with psycopg.connect(libpq_dsn(dsn), autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT agentdb_distributed()").fetchone()
    return bool(row and row[0])


def main(args: argparse.Namespace) -> int:
    """Run the demo (``agentdb demo``); return the exit status.

    Raises:
        ConfigurationError: a count below 1, a timeout that is not a positive number of
            seconds, or no ``--dsn`` and pgserver is not installed.
        DatabaseUnavailable, MigrationError: the database cannot be used.
        DemoTimeout: the run passed its ``--timeout`` (its processes were stopped).
    """
    if args.tasks < 1 or args.tenants < 1 or args.workers < 1 or args.relays < 1:
        raise ConfigurationError("--tasks, --tenants, --workers and --relays must be at least 1")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigurationError("--timeout must be a number of seconds more than 0")
    w = Workload(
        tasks=args.tasks, tenants=args.tenants, workers=args.workers, relays=args.relays,
        kill_every=KILL_EVERY if args.kill_every is None else args.kill_every,
        timeout=args.timeout, seed=args.seed,
    )  # fmt: skip
    # From here: the migrations count against the timeout too.
    limits = Limits(w.timeout)

    def body(dsn: str, log: IO[bytes], log_path: Path) -> int:
        run = w
        if args.kill_every is None and _distributed(dsn):
            run = replace(w, kill_every=CITUS_KILL_EVERY)
            print(f"killing a process every {CITUS_KILL_EVERY:g}s on average (on Citus)",
                  file=sys.stderr)  # fmt: skip
        status = report(run, run_async(lambda: run_workload(dsn, run, log, log_path, limits)))
        if getattr(args, "console", False):
            from agentdb.tools.demo.console import serve_console

            limits.extend(float("inf"))  # the console stays until Ctrl-C
            serve_console(dsn, log, port=args.console_port)
        return status

    try:
        with limits.guard():
            return with_database(args.dsn, body, limits)
    except DemoStopped as exc:
        print(f"agentdb: {exc}", file=sys.stderr)
        return 128 + exc.signum
