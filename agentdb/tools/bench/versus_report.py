"""The agentdb-against-DBOS section of the report: rows, ratios, WAL breakdowns, guarantees.

Reads ``results["versus"]`` (:func:`agentdb.tools.bench.versus.bench_versus`);
nothing here touches a database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentdb.tools.bench.harness import median

__all__ = ["GUARANTEES", "breakdown_lines", "versus_section"]

_TITLES = {"unit": "single-effect unit", "agent_run": "agent run"}
_TOP_RELATIONS = 14
_TOP_TYPES = 10

#: What each side guarantees that the other does not (the same unit of work, not the same
#: promises: the WAL and CPU each side spends buy these).
GUARANTEES = (
    "**agentdb, not DBOS:** tenants in the database - every row carries its tenant, row-level "
    "security confines an agent role to its tenant, fair claiming across tenants (G18); "
    "lease fencing - every write of a run is refused once its lease is gone, so a worker "
    "that lost its task (a pause, a partition) cannot record a step, an effect or a result "
    "(G20); the reservation of an external call is committed *before* the call, with the "
    "canonical hash of its input, so a retry with other arguments is a conflict, never a "
    "replay, and an unknown outcome is reconciled or parked, not silently repeated "
    "(G4, G13); an append-only audit event for every transition (who, what, which version; "
    "the trail an operator or a regulator reads) in the transaction that made it; approvals "
    "refused from the agent that holds the task; an outbox row delivered at least once to "
    "outside consumers by a relay; budgets and rate limits held in the reservation (G19).",
    "**DBOS, not agentdb:** workflows written as ordinary Python whose every step's output "
    "is checkpointed and replayed in order after a crash (deterministic replay by step "
    "position); workflow inputs and outputs stored and queryable, forks and restarts from "
    "any step; `recv`/`send` messages and `set_event`/`get_event` between workflows and "
    "clients; queues with per-executor and global concurrency, rate limits, priorities, "
    "partitions and deduplication; recovery of an executor's pending workflows by executor "
    "id; no tenant, lease or audit model - a step's result is recorded *after* the call, so "
    "a crash between the call and its checkpoint calls again (at-least-once steps, "
    "idempotency left to the provider), and any process that can reach the system database "
    "can write any workflow's rows.",
)


def _fmt(v: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:,.{digits}f}"


def _rng(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "n/a"
    return (
        f"{_fmt(median(values), digits)} ({_fmt(min(values), digits)}-{_fmt(max(values), digits)})"
    )


def _ratio(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "n/a"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    rule = "|" + "".join("---|" if i < left else "---:|" for i in range(len(head)))
    return ["| " + " | ".join(head) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows), ""]


def breakdown_lines(v: dict[str, Any]) -> list[str]:
    """Each workload's WAL per unit, by relation and by record type, both sides."""
    out: list[str] = []
    for workload, title in _TITLES.items():
        rows = [r for r in v["rows"] if r["workload"] == workload and r["breakdown"]]
        for r in rows:
            b = r["breakdown"]
            out += [
                f"**{r['side']}, {title}** ({b['units']:,} units; "
                f"{_fmt(b['bytes_per_unit'])} bytes and {_fmt(b['records_per_unit'], 1)} "
                f"records per unit, {_fmt(b['fpi_bytes_per_unit'])} of them full-page images):",
                "",
                *_table(
                    ("relation", "bytes/unit", "of which FPI", "records/unit"),
                    [
                        (x["name"], _fmt(x["bytes"]), _fmt(x["fpi_bytes"]), _fmt(x["records"], 2))
                        for x in b["by_relation"][:_TOP_RELATIONS]
                    ],
                ),
                *_table(
                    ("record type", "bytes/unit", "of which FPI", "records/unit"),
                    [
                        (x["name"], _fmt(x["bytes"]), _fmt(x["fpi_bytes"]), _fmt(x["records"], 2))
                        for x in b["by_type"][:_TOP_TYPES]
                    ],
                ),
            ]
    return out


def versus_section(r: dict[str, Any]) -> list[str]:
    """``## 7. agentdb against DBOS``, or nothing when it did not run."""
    v = r.get("versus")
    if not v:
        return []
    rows = [
        (
            _TITLES[x["workload"]], x["side"], f"{x['units_per_run']:,}",
            _rng(x["units_per_s"]), _rng(x["enqueued_per_s"]),
            _fmt(median(x["server_cpu_us_per_unit"])), _fmt(median(x["worker_cpu_us_per_unit"])),
            f"{_fmt(median(x['wal_bytes_per_unit']))}"
            + (f" ({_fmt(median(x['fpi_bytes_per_unit']))})" if x["fpi_bytes_per_unit"] else ""),
            _fmt(median(x["p50_ms"]), 1), _fmt(median(x["p95_ms"]), 1),
        )
        for x in v["rows"]
    ]  # fmt: skip
    ratio_rows = [
        (_TITLES[x["workload"]], x["metric"], _ratio(x["median"]),
         ", ".join(f"{q:.2f}" for q in x["ratios"]))
        for x in v["ratios"]
    ]  # fmt: skip
    wal_how = (
        "each database's own records, read back with `pg_waldump` (a record with a block "
        "in the database, and the commits of its transactions; checkpoints and other "
        "databases left out), full-page images in brackets"
        if v["wal_per_database"]
        else "cluster-wide WAL positions (pg_waldump could not read the server's WAL: other "
        "databases' writes count too)"
    )
    return [
        "## 7. agentdb against DBOS",
        "",
        f"The same units of work on {v['workers']} worker processes x concurrency "
        f"{v['concurrency']} per side, both polling every {v['poll_ms']:.0f} ms, durability "
        "untouched, each side in a database of its own on the same server. **Single-effect "
        "unit**: a tenant's unit enqueued idempotently (agentdb `tasks.create` with a dedupe "
        "key; DBOS `DBOSClient.enqueue` with the workflow id as key), picked up, one external "
        "call ledgered (agentdb `job.effect`: reserved and committed before the call; DBOS a "
        "`@DBOS.step`), one outbox / notification record (an outbox message; "
        "`DBOS.set_event`). **Agent run**: model step → tool effect → approval wait → tool "
        "effect → finish (agentdb: `job.step`, `job.effect`, `job.wait_for_signal`, "
        "`job.effect`, approved by the driver with `signals.approve`; DBOS: a workflow of "
        "steps and `DBOS.recv`, approved with `DBOSClient.send`). The driver enqueues 8 at a "
        "time while the workers drain; units/s runs from the first enqueue to the last "
        "finish, enqueued/s to the last enqueue. Server CPU: the database's backends; worker "
        f"CPU: the worker processes'. WAL: {wal_how}. Latency: enqueue to finish, from each "
        "side's own rows (a backlog builds when the workers are slower than the driver: "
        "then it is mostly queueing)."
        + (
            f" **History**: each side ran {v['history']:,} single-effect units first, "
            "unmeasured, and a CHECKPOINT ran before each measured run: the WAL of a "
            "database whose indexes are larger than a run, with the full-page image each "
            "page pays on its first change after a checkpoint."
            if v.get("history")
            else ""
        )
        + (
            f" **Warm-up**: each run's processes first drove {v['warmup']:,} units of the "
            "same workload for another tenant, left out of every figure, so each pooled "
            "connection had planned its statements and learnt its types (what a long-running "
            "worker pays once)."
            if v.get("warmup")
            else ""
        ),
        "",
        *_table(
            (
                "workload",
                "side",
                "units/run",
                "units/s",
                "enqueued/s",
                "server CPU µs/unit",
                "worker CPU µs/unit",
                "WAL bytes/unit (FPI)",
                "p50 ms",
                "p95 ms",
            ),
            rows,
            left=2,
        ),
        "Ratios, agentdb ÷ DBOS (median of the per-repetition ratios; each repetition's "
        "pair ran back to back):",
        "",
        *_table(("workload", "metric", "agentdb ÷ DBOS", "per repetition"), ratio_rows, left=2),
        "### WAL by relation and record type, per unit (the last repetition)",
        "",
        *breakdown_lines(v),
        "### What each side guarantees that the other does not",
        "",
        *(f"- {g}" for g in GUARANTEES),
        "",
    ]
