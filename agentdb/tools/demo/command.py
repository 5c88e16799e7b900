"""Registers ``agentdb demo``; the demo itself is imported only when it runs."""

from __future__ import annotations

import argparse

from agentdb.tools._common import add_pooler

__all__ = ["CITUS_KILL_EVERY", "KILL_EVERY", "add_demo"]

#: Mean seconds between SIGKILLs by default. On Citus a restarted process opens its
#: connections through the coordinator to every worker node before its first claim:
#: killed every half second, few of them ever claimed (23 of 200 tasks in 100 s).
KILL_EVERY = 0.5
CITUS_KILL_EVERY = 3.0


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run a multi-tenant agent workload with crashes and report")
    p.add_argument("--dsn", help="run against this Postgres (default: an embedded one)")
    add_pooler(p)
    p.add_argument("--tasks", type=int, default=300, help="tasks to run (default 300)")
    p.add_argument("--tenants", type=int, default=5, help="tenants (default 5)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--relays", type=int, default=2, help="relay processes (default 2)")
    p.add_argument(
        "--kill-every",
        type=float,
        default=None,
        help="mean seconds between SIGKILLs, the first by half-way (0: none; default 0.5, "
        f"{CITUS_KILL_EVERY:g} on a Citus cluster, where a process takes longer to start)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=100.0,
        help="give up after this many seconds, migrations and counts included (default 100)",
    )
    p.add_argument("--seed", type=int, help="random seed for kills and provider faults")
    p.add_argument(
        "--console",
        action="store_true",
        help="after the report, leave the operator's console up with invoices to approve",
    )
    p.add_argument("--console-port", type=int, default=8765, help="its port (default 8765)")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from agentdb.tools.demo.report import main

    return main(args)
