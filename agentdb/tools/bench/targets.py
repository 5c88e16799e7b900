"""The bench's targets: each measured figure against its goal, as data.

:func:`targets` reads the results dictionary :func:`agentdb.tools.bench.runner.run`
builds; ``results.json`` carries the list, and the report's Targets table renders it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from agentdb.tools.bench.harness import median, ratios

__all__ = [
    "BY_HAND", "DURABLE", "PGQ_DEFAULT", "PGQ_TUNED", "RAW_DRAIN", "WORKER_10", "WORKER_100",
    "Target", "by_name",
    "relays_by_name",
    "target_row", "targets", "throughput_ratio", "versus_targets",
]  # fmt: skip

WORKER_10 = "agentdb Worker processes, concurrency 10"
WORKER_100 = "agentdb Worker processes, concurrency 100"
DURABLE = "agentdb durable handler (6 steps, re-entered 5 times)"
BY_HAND = "agentdb the same by hand (job.reserve, current_step)"
PGQ_DEFAULT = "PgQueuer default (batch 10)"
PGQ_TUNED = "PgQueuer tuned (batch 250)"
RAW_DRAIN = "raw SKIP LOCKED, one statement"


def by_name(r: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(c["name"], c["workers"]): c for c in r["cycle"]}


def relays_by_name(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["name"]: x for x in r["relay"]}


def throughput_ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """Median tasks/s of ``a`` over ``b``; None if either was not measured."""
    if not a or not b or not a["tasks_per_s"] or not b["tasks_per_s"]:
        return None
    return median(a["tasks_per_s"]) / median(b["tasks_per_s"])


_SINGLE = "agentdb, one statement per step"
_BATCHED = "agentdb batched, batch 250"
_NOOP = "agentdb no-op tasks, batch 250"


class Target(TypedDict):
    """One target: ``measured`` against ``goal`` (a ratio unless ``unit`` says otherwise);
    ``met`` is None when it was not measured (``measured`` None, ``detail`` says why) or is
    only for reference (``goal`` None)."""

    name: str
    measured: float | None
    goal: float | None
    higher_is_better: bool
    unit: str
    met: bool | None
    detail: str


def _target(
    name: str,
    measured: float | None,
    goal: float | None,
    *,
    higher: bool = True,
    unit: str = "x",
    detail: str = "",
) -> Target:
    met = None
    if measured is not None and goal is not None:
        met = measured >= goal if higher else measured <= goal
    return Target(name=name, measured=measured, goal=goal, higher_is_better=higher,
                  unit=unit, met=met, detail=detail)  # fmt: skip


def _statement_targets(r: dict[str, Any]) -> list[Target]:
    name = "{}: helper ÷ raw asyncpg"
    return [
        _target(name.format(s["statement"]), median(ratios(s["agentdb"], s["raw"])), 0.95)
        for s in r["statements"]
    ]


def _vs(
    r: dict[str, Any], name: str, ours: str, peer: str, goal: float | None, workers: int = 4
) -> Target:
    by = by_name(r)
    ratio = throughput_ratio(by.get((ours, workers)), by.get((peer, workers)))
    why = "" if ratio is not None else f"not measured: {peer if (ours, workers) in by else ours}"
    return _target(name, ratio, goal, detail=why)


def _server_cpu(r: dict[str, Any], name: str, goal: float) -> Target:
    row = by_name(r).get((name, 4))
    cpu = row.get("server_cpu_us_per_task") if row else None
    if not cpu:
        why = "not measured: the server's CPU is read only on a server this machine runs"
        return _target(f"server CPU per task, {name}, 4 workers", None, goal, higher=False,
                       unit="µs", detail=why)  # fmt: skip
    return _target(f"server CPU per task, {name}, 4 workers", median(cpu), goal, higher=False,
                   unit="µs")  # fmt: skip


def _cycle_targets(r: dict[str, Any]) -> list[Target]:
    return [
        _vs(r, "agentdb worker processes (concurrency 10), full cycle, 4 ÷ PgQueuer default",
            WORKER_10, PGQ_DEFAULT, 1.0),
        _vs(r, "agentdb worker processes (concurrency 100), full cycle, 4 ÷ PgQueuer default",
            WORKER_100, PGQ_DEFAULT, 1.0),
        _vs(r, "one statement per step (the library's single calls), full cycle, 4 workers"
            " ÷ PgQueuer default", _SINGLE, PGQ_DEFAULT, None),
        _vs(r, "batched full cycle (batch 250), 4 workers ÷ PgQueuer default",
            _BATCHED, PGQ_DEFAULT, 1.5),
        _vs(r, "batched full cycle (batch 250), 4 workers ÷ PgQueuer tuned",
            _BATCHED, PGQ_TUNED, 0.6),
        _vs(r, "no-op cycle (claim + finish), 4 workers ÷ PgQueuer tuned", _NOOP, PGQ_TUNED, 1.0),
        _server_cpu(r, _BATCHED, 300.0),
        _vs(r, "durable handler (G25) ÷ the same by hand, 4 worker processes", DURABLE, BY_HAND,
            None),
        _cpu_vs(r, "durable handler ÷ by hand, server CPU per task, 4 worker processes",
                DURABLE, BY_HAND),
    ]  # fmt: skip


def _cpu_vs(r: dict[str, Any], name: str, ours: str, theirs: str) -> Target:
    by = by_name(r)
    a, b = by.get((ours, 4)), by.get((theirs, 4))
    if not a or not b or not a.get("server_cpu_us_per_task") or not b.get("server_cpu_us_per_task"):
        return _target(name, None, None, higher=False, detail="not measured")
    ratio = median(a["server_cpu_us_per_task"]) / median(b["server_cpu_us_per_task"])
    return _target(name, ratio, None, higher=False)


def _relay_targets(r: dict[str, Any]) -> list[Target]:
    relays = relays_by_name(r)
    raw = relays[RAW_DRAIN]["rows_per_s"]
    out: list[Target] = []
    for name in ("agentdb Relay.drain()", "agentdb outbox.claim + mark_delivered"):
        ratio = median(ratios(relays[name]["rows_per_s"], raw))
        out.append(_target(f"{name} ÷ raw one-statement drain", ratio, 0.8))
    return out


def _flat_target(p50: dict[str, list[float]], sizes: list[int], label: str) -> Target:
    """The claim stays flat: p50 at the larger size ≤ 1.2x p50 at the smaller."""
    small, large = (str(n) for n in sizes)
    ratio = median(p50[large]) / median(p50[small])
    return _target(label.format(small=int(small), large=int(large)), ratio, 1.2, higher=False)


def _budget_targets(r: dict[str, Any]) -> list[Target]:
    if "budget" not in r:
        return []
    return [_target("reserve with a budget ÷ reserve without (G19)", r["budget"]["ratio"], 0.9)]


def _pickup_targets(r: dict[str, Any]) -> list[Target]:
    p = r.get("pickup")
    listen, poll = "pickup latency p95, LISTEN, idle worker", "pickup latency p95, polling alone"
    if not p:
        return [_target(name, None, goal, higher=False, unit="ms", detail="not measured")
                for name, goal in ((listen, 10.0), (poll, None))]  # fmt: skip
    every = p["poll_interval_ms"]
    return [
        _target(listen, p["listen"]["p95_ms"], 10.0, higher=False, unit="ms"),
        _target(
            f"{poll} every {every:.0f} ms", p["poll"]["p95_ms"], every + 10, higher=False, unit="ms"
        ),
    ]


def _snapshot_targets(r: dict[str, Any]) -> list[Target]:
    h = r.get("snapshot")
    if not h:
        return [_target("throughput lost under a held snapshot", None, 15.0, higher=False,
                        unit="%", detail="not measured")]  # fmt: skip
    name = f"throughput lost under a snapshot held for {h['held']['seconds']:.0f} s"
    return [_target(name, h["loss_pct"], 15.0, higher=False, unit="%")]


#: agentdb ÷ DBOS (issue 41): (workload, metric key, goal, higher is better, name)
_VERSUS_GOALS = (
    ("unit", "units_per_s", 4.0, True, "single-effect unit: agentdb ÷ DBOS units/s"),
    ("agent_run", "units_per_s", 4.0, True, "agent run: agentdb ÷ DBOS units/s"),
    ("unit", "server_cpu_us_per_unit", 0.5, False,
     "single-effect unit: agentdb ÷ DBOS server CPU per unit"),
    ("agent_run", "server_cpu_us_per_unit", 0.5, False,
     "agent run: agentdb ÷ DBOS server CPU per unit"),
    ("unit", "wal_bytes_per_unit", 1.0, False, "single-effect unit: agentdb ÷ DBOS WAL per unit"),
    ("agent_run", "wal_bytes_per_unit", None, False, "agent run: agentdb ÷ DBOS WAL per unit"),
)  # fmt: skip


def versus_targets(r: dict[str, Any]) -> list[Target]:
    """agentdb against DBOS, when it ran (issue 41's goals)."""
    v = r.get("versus")
    if not v:
        return []
    found = {(x["workload"], x["key"]): x["median"] for x in v["ratios"]}
    out = []
    for workload, key, goal, higher, name in _VERSUS_GOALS:
        value = found.get((workload, key))
        ok = value is not None and value == value  # not NaN
        out.append(_target(name, value if ok else None, goal, higher=higher,
                           detail="" if ok else "not measured"))  # fmt: skip
    return out


def targets(r: dict[str, Any]) -> list[Target]:
    """Every target, measured or not (``met`` None), in the report's order."""
    if "statements" not in r:  # only agentdb against DBOS ran
        return versus_targets(r)
    return [
        *_statement_targets(r), *_budget_targets(r), *_cycle_targets(r), *_relay_targets(r),
        _flat_target(r["scaling"]["p50_ms"], r["scaling"]["sizes"],
                     "claim p50 at {large:,} rows ÷ at {small:,}"),
        _flat_target(r["scaling_tenants"]["p50_ms"], r["scaling_tenants"]["tenants"],
                     "claim p50 with {large:,} tenants ÷ with {small:,} (G18)"),
        *_pickup_targets(r), *_snapshot_targets(r), *versus_targets(r),
    ]  # fmt: skip


def target_row(t: Target) -> tuple[str, str, str, str]:
    digits = 3 if t["unit"] == "x" else 0
    value = "n/a" if t["measured"] is None else f"{t['measured']:.{digits}f}{t['unit']}"
    goal = "-" if t["goal"] is None else (
        f"{'≥' if t['higher_is_better'] else '≤'} {t['goal']:g}{t['unit']}")  # fmt: skip
    verdict = {True: "met", False: "missed", None: "n/a"}[t["met"]]
    if t["detail"]:
        verdict += f" ({t['detail']})"
    return (t["name"], value, goal, verdict)
