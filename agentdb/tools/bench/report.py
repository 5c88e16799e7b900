"""The bench's outputs: ``report.md`` (also printed), ``results.json``, ``chart.png``.

Everything here reads the results dictionary :func:`agentdb.tools.bench.runner.run`
builds; nothing touches a database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentdb.tools.bench.harness import median, ratios
from agentdb.tools.bench.targets import (
    PGQ_DEFAULT,
    RAW_DRAIN,
    by_name,
    relays_by_name,
    target_row,
    targets,
    throughput_ratio,
)
from agentdb.tools.bench.versus_report import versus_section

__all__ = ["render", "write_outputs"]


def _fmt(v: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:,.{digits}f}"


def _fmt_range(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "n/a"
    return (
        f"{_fmt(median(values), digits)} ({_fmt(min(values), digits)}-{_fmt(max(values), digits)})"
    )


def _pct(values: Sequence[float]) -> str:
    return "n/a" if not values else f"{median(values) * 100:.0f} %"


# --- report.md ---------------------------------------------------------------


def _header(r: dict[str, Any]) -> list[str]:
    m = r["meta"]
    v = m["versions"]
    settings = ", ".join(f"{k}={val}" for k, val in sorted(m["settings"].items()))
    return [
        "# agentdb benchmarks",
        "",
        f"{m['date']} · {m['mode']} run · {m['reps']} interleaved repetitions · "
        f"{m['cpu_count']} CPU cores ({m['machine']}, {m['platform']}) · "
        f"load average {m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after · "
        f"{m['seconds']:.0f} s in all",
        "",
        f"Server: PostgreSQL {v['postgres']} ({m['server']}; {settings}); client and server "
        "share this machine.",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "postgres"),
        "",
        "Every figure is the median over the repetitions, with min-max in brackets. Contenders "
        "ran back to back inside each repetition (A B A B …) in one Python process on the "
        "default asyncio loop; ratios are taken per repetition, then the median.",
        "",
    ]


def _table(head: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table: ``head`` is (title, ``"<"`` left or ``">"`` right aligned) per column."""

    def line(cells: Iterable[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "".join("---|" if align == "<" else "---:|" for _, align in head)
    return [line(title for title, _ in head), rule, *(line(row) for row in rows), ""]


def _statement_rows(statements: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            s["statement"],
            _fmt_range(s["agentdb"]),
            _fmt_range(s["raw"]),
            _fmt_range(ratios(s["agentdb"], s["raw"]), 2),
            f"{_fmt(median(s['helper_client_us']))} / {_fmt(median(s['raw_client_us']))}",
            f"{_fmt(median(s['helper_server_us']))} / {_fmt(median(s['raw_server_us']))}",
        )
        for s in statements
    ]


_STATEMENT_HEAD = [
    ("statement", "<"),
    ("agentdb helper, ops/s", ">"),
    ("raw asyncpg, same SQL, ops/s", ">"),
    ("helper ÷ raw", ">"),
    ("client CPU µs/op, helper / raw", ">"),
    ("server CPU µs/op, helper / raw", ">"),
]


def _budget_section(r: dict[str, Any]) -> list[str]:
    if "budget" not in r:
        return []
    b = r["budget"]
    head = [("reserve", "<"), ("reserves/s", ">")]
    rows = [
        ("with a budget (cost held in the same statement)", _fmt_range(b["with"])),
        ("without", _fmt_range(b["without"])),
    ]
    return [
        "## 1c. The cost of a budget (G19)",
        "",
        f"{b['ops_per_rep']} reserves per variant per repetition on {b['connections']} "
        "connections, interleaved; each connection's task has its own budget. "
        f"Ratio (median of the repetitions): **{b['ratio']:.3f}x**.",
        "",
        *_table(head, rows),
        "",
    ]


def _pooled_section(r: dict[str, Any]) -> list[str]:
    pooled = r.get("statements_pgbouncer") or []
    if not pooled:
        return []
    direct = {s["statement"]: s for s in r["statements"]}
    cost = [
        (
            s["statement"],
            _fmt(median(s["raw"]) / median(direct[s["statement"]]["raw"]), 2),
            _fmt(median(s["agentdb"]) / median(direct[s["statement"]]["agentdb"]), 2),
        )
        for s in pooled
        if s["statement"] in direct
    ]
    return [
        "## 1b. Statement overhead through PgBouncer (transaction mode)",
        "",
        "The same pairs through a local PgBouncer in `pool_mode = transaction`, with the "
        "pooler switch: both the helper and the raw SQL run as unnamed statements "
        "(asyncpg's statement cache off), so the ratio is agentdb's own overhead on that "
        "path; the second table is what the proxy and the unnamed statements cost against "
        "the direct, cached run above.",
        "",
        *_table(_STATEMENT_HEAD, _statement_rows(pooled)),
        *_table(
            [("statement", "<"), ("raw: proxy ÷ direct", ">"), ("helper: proxy ÷ direct", ">")],
            cost,
        ),
    ]


def _statements_section(r: dict[str, Any]) -> list[str]:
    s0 = r["statements"][0]
    return [
        "## 1. Statement overhead",
        "",
        f"{s0['connections']} connections, {s0['ops_per_rep']:,} statements per variant per "
        "repetition; the raw variant sends the same SQL text with the same arguments through "
        "`conn.fetch` on the same connections.",
        "",
        *_table(_STATEMENT_HEAD, _statement_rows(r["statements"])),
    ]


def _cycle_section(r: dict[str, Any]) -> list[str]:
    by = by_name(r)
    head = [
        ("path", "<"),
        *((title, ">") for title in ("workers", "tasks/run", "tasks/s", "vs PgQueuer default")),
        *((title, ">") for title in ("client CPU", "server CPU", "client CPU µs/task")),
        *((title, ">") for title in ("server CPU µs/task", "WAL bytes/task")),
    ]
    rows = []
    for c in r["cycle"]:
        ratio = throughput_ratio(c, by.get((PGQ_DEFAULT, c["workers"])))
        rows.append(
            (
                c["name"],
                str(c["workers"]),
                f"{c['tasks_per_run']:,}",
                _fmt_range(c["tasks_per_s"]),
                "n/a" if ratio is None else f"{ratio:.2f}x",
                _pct(c["client_cpu_share"]),
                _pct(c["server_cpu_share"]),
                _fmt(median(c["client_cpu_us_per_task"])),
                _fmt(median(c["server_cpu_us_per_task"])),
                _fmt(median(c["wal_bytes_per_task"])),
            )
        )
    return [
        "## 2. Task cycle",
        "",
        "agentdb: claim under a lease → reserve an operation → complete it → finish the task "
        "(state + event + one outbox row; the lease is dropped). PgQueuer and Procrastinate run "
        "no-op jobs (no operation ledger, no audit event, no outbox). Throughput is counted "
        "from the first job handed out to the last completion committed.",
        "",
        *_table(head, rows),
        "Client CPU is the bench process's CPU time over the run's wall time (100 % = one core "
        "busy: the Python client is the bottleneck); server CPU is the run database's backends "
        "on the same scale (the machine has "
        f"{r['meta']['cpu_count']} cores for both); WAL is cluster-wide: "
        + (
            "the bench's own embedded cluster, which nothing else writes to."
            if r["meta"]["server"].startswith("embedded")
            else "on a shared server other databases' writes count too (the embedded "
            "default measures it alone)."
        ),
        "",
    ]


def _relay_section(r: dict[str, Any]) -> list[str]:
    raw = relays_by_name(r)[RAW_DRAIN]["rows_per_s"]
    first = r["relay"][0]
    head = [
        ("relay", "<"),
        ("how", "<"),
        ("rows/s", ">"),
        ("÷ raw one-statement", ">"),
        ("client CPU", ">"),
    ]
    rows = [
        (
            x["name"],
            x["how"],
            _fmt_range(x["rows_per_s"]),
            _fmt_range(ratios(x["rows_per_s"], raw), 2),
            _pct(x["client_cpu_share"]),
        )
        for x in r["relay"]
    ]
    return [
        "## 3. Outbox relay",
        "",
        f"One relay, batch {first['batch']}, {first['rows_per_run']:,} rows per "
        "run, a publisher that returns at once.",
        "",
        *_table(head, rows),
    ]


def _tenant_scaling_section(r: dict[str, Any]) -> list[str]:
    st = r["scaling_tenants"]
    head = [("tenants", ">"), ("tasks each", ">"), ("claim p50, ms", ">")]
    rows = [
        (f"{n:,}", f"{max(1, st['tasks'] // n):,}", _fmt_range(st["p50_ms"][str(n)], 3))
        for n in st["tenants"]
    ]
    few, many = (str(n) for n in st["tenants"])
    return [
        "## 4b. Scaling with tenants: the fair claim (G18)",
        "",
        f"The same {st['tasks']:,} pending tasks spread over few and over many tenants; "
        f"`leases.claim(batch=1)` passing the last tenant it was given, as the worker does, "
        f"{st['claims_per_rep']:,} timed claims per database per repetition.",
        "",
        *_table(head, rows),
        f"p50 ratio {int(many):,} ÷ {int(few):,} tenants: "
        f"{_fmt_range(ratios(st['p50_ms'][many], st['p50_ms'][few]), 2)}; index path: "
        f"{'yes' if st['index_path'] else 'NO'}.",
        "",
        f"The claim's plan with {int(many):,} tenants (EXPLAIN ANALYZE, rolled back):",
        "",
        "```",
        st["explain"],
        "```",
        "",
    ]


def _pickup_section(r: dict[str, Any]) -> list[str]:
    p = r.get("pickup")
    if not p:
        return []
    head = [("wake-up", "<"), ("p50, ms", ">"), ("p95, ms", ">"), ("max, ms", ">")]
    rows = [
        (how, _fmt(p[mode]["p50_ms"], 1), _fmt(p[mode]["p95_ms"], 1), _fmt(p[mode]["max_ms"], 1))
        for mode, how in (
            ("listen", "LISTEN/NOTIFY"),
            ("poll", f"polling alone, every {p['poll_interval_ms']:.0f} ms"),
        )
    ]
    return [
        "## 5. Pickup latency",
        "",
        f"An idle `Worker` (concurrency 1): {p['samples']} tasks created one at a time, each "
        "after a random pause; from `tasks.create` being called to the handler's first "
        "line (the create's own round trip included: the commit lands inside the call).",
        "",
        *_table(head, rows),
    ]


def _snapshot_section(r: dict[str, Any]) -> list[str]:
    h = r.get("snapshot")
    if not h:
        return []
    head = [("run", "<"), ("arrived/s", ">"), ("finished/s", ">"), ("backlog", ">"),
            ("claim p50, ms", ">"), ("claim p99, ms", ">"),
            ("dead rows added: tasks / operations / outbox", ">"),
            ("size added, kB", ">")]  # fmt: skip
    rows = []
    for run, label in ((h["free"], "nothing else open"), (h["held"], "snapshot held")):
        dead, grew = run["dead_rows_added"], run["bytes_added"]
        rows.append((
            label, _fmt(run["created_per_s"]), _fmt(run["tasks_per_s"]), _fmt(run["backlog"]),
            _fmt(run["claim_p50_ms"], 2), _fmt(run["claim_p99_ms"], 2),
            " / ".join(_fmt(dead[t]) for t in ("agent_tasks", "agent_operations", "agent_outbox")),
            _fmt(sum(grew.values()) / 1024),
        ))  # fmt: skip
    loss = h["loss_pct"]
    return [
        "## 5b. Throughput under a held snapshot",
        "",
        f"The batched full cycle (4 workers, claim 10) at a fixed offered rate "
        f"({h['free']['offered_per_s']:.0f} tasks/s) for "
        f"{h['free']['seconds']:.0f} s, then as long again while another connection to the "
        "database holds a REPEATABLE READ snapshot taken as the run starts (no row version "
        "the cycle replaces can be pruned or vacuumed). Dead rows and size: added during the "
        "run (pg_stat_user_tables, heap and indexes).",
        "",
        *_table(head, rows),
        "",
        "Throughput lost with the snapshot held (the share of arrivals finished in the "
        f"window, against the free run's): {'n/a' if loss is None else f'{loss:.1f} %'}.",
    ]


def _citus_section(r: dict[str, Any]) -> list[str]:
    c = r.get("citus")
    if not c:
        return []
    tps = c["tasks_per_s"]
    head = [("workers", ">"), ("plain, tasks/s", ">"), ("Citus, tasks/s", ">"), ("ratio", ">")]
    nodes = "citus_nodes" in tps
    if nodes:
        head += [("on the worker nodes, tasks/s", ">"), ("ratio", ">")]
    rows = [
        (
            str(w), _fmt_range(tps["plain"][str(w)], 0), _fmt_range(tps["citus"][str(w)], 0),
            _fmt_range(ratios(tps["citus"][str(w)], tps["plain"][str(w)]), 2),
            *((_fmt_range(tps["citus_nodes"][str(w)], 0),
               _fmt_range(ratios(tps["citus_nodes"][str(w)], tps["plain"][str(w)]), 2))
              if nodes else ()),
        )
        for w in c["workers"]
    ]  # fmt: skip
    return [
        "## 6. Citus against plain Postgres on the same box",
        "",
        f"{c['tasks']:,} tasks over 8 tenants per run: claim one, finish it under its lease "
        f"(`tasks.transition`), until none is left; a Citus cluster of {c['nodes']} nodes on "
        "this machine against a plain database on the coordinator's server. Every node shares "
        "the same cores, so this is the per-statement cost of distribution, not scale-out. "
        "On the worker nodes: the loops connected to the worker nodes in turn, not the "
        "coordinator.",
        "",
        *_table(head, rows),
        "",
        *_remote_lines(c, tps),
    ]


def _remote_lines(c: dict[str, Any], tps: dict[str, dict[str, list[float]]]) -> list[str]:
    """The scaling ratio and the remote commands per task, when the run counted them."""
    first, last = (str(w) for w in (c["workers"][0], c["workers"][-1]))
    scale = ratios(tps["citus"][last], tps["citus"][first])
    lines = [f"Citus with {last} loops against {first}: {_fmt_range(scale, 2)}x"]
    if "citus_nodes" in tps:
        on = ratios(tps["citus_nodes"][last], tps["citus_nodes"][first])
        lines[0] += f" ({_fmt_range(on, 2)}x on the worker nodes)"
    lines[0] += "."
    rc = c.get("remote_commands")
    if rc:
        lines += [
            "",
            f"Remote commands the coordinator sent the workers per finished task, with "
            f"{rc['loops']} loops (`citus.log_remote_commands`, a run of its own): "
            f"{rc['claim_per_task']:.1f} for the claim, {rc['finish_per_task']:.1f} for the "
            f"finish; PREPARE TRANSACTION: {rc['prepare_transaction']}.",
        ]
    return [*lines, ""]


def _scaling_section(r: dict[str, Any]) -> list[str]:
    sc = r["scaling"]
    head = [("tasks in the table", ">"), ("claim p50, ms", ">"), ("claim p99, ms", ">")]
    rows = [
        (f"{n:,}", _fmt_range(sc["p50_ms"][str(n)], 3), _fmt_range(sc["p99_ms"][str(n)], 3))
        for n in sc["sizes"]
    ]
    small, large = (str(n) for n in sc["sizes"])
    return [
        "## 4. Scaling: claim latency",
        "",
        f"`leases.claim(batch=1)` on one connection, {sc['claims_per_rep']:,} timed claims per "
        "table per repetition, all tasks pending (a backlog: every row is in the claim index).",
        "",
        *_table(head, rows),
        f"p50 ratio {int(large):,} ÷ {int(small):,}: "
        f"{_fmt_range(ratios(sc['p50_ms'][large], sc['p50_ms'][small]), 2)}; index path: "
        f"{'yes' if sc['index_path'] else 'NO'}.",
        "",
        f"The claim's plan at {sc['explain_rows']:,} rows (EXPLAIN ANALYZE, rolled back):",
        "",
        "```",
        sc["explain"],
        "```",
        "",
    ]


def _targets_section(r: dict[str, Any]) -> list[str]:
    head = [("target", "<"), ("measured", ">"), ("goal", ">"), ("verdict", "<")]
    rows = (target_row(t) for t in r.get("targets") or targets(r))
    return ["## Targets", "", *_table(head, rows)]


def _notes_section(r: dict[str, Any]) -> list[str]:
    problems = [
        f"{c['name']} ({c['workers']} w): {e}" for c in r.get("cycle", []) for e in c["errors"]
    ]
    problems += [f"{x['name']}: {e}" for x in r.get("relay", []) for e in x["errors"]]
    problems += [
        f"{x['side']}, {x['workload']}: {e}"
        for x in (r.get("versus") or {}).get("rows", [])
        for e in x["errors"]
    ]
    if not r["notes"] and not problems:
        return []
    return ["## Notes", "", *(f"- {note}" for note in (*r["notes"], *problems)), ""]


def render(r: dict[str, Any]) -> str:
    """The markdown report (also printed to stdout)."""
    if "statements" not in r:  # --dbos-only / --wal-breakdown
        only = (_header, versus_section, _targets_section, _notes_section)
        return "\n".join(line for section in only for line in section(r))
    sections = (
        _header,
        _statements_section,
        _budget_section,
        _pooled_section,
        _cycle_section,
        _relay_section,
        _scaling_section,
        _tenant_scaling_section,
        _pickup_section,
        _snapshot_section,
        _citus_section,
        versus_section,
        _targets_section,
        _notes_section,
    )
    return "\n".join(line for section in sections for line in section(r))


# --- chart.png ---------------------------------------------------------------


def _bars(
    ax: Any,
    labels: list[str],
    series: list[tuple[str, list[list[float]]]],
    title: str,
    unit: str,
    log: bool = False,
) -> None:
    """Grouped bars of the medians, one group per label, error bars spanning min-max."""
    width = 0.8 / max(1, len(series))
    for k, (name, samples) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        med = [median(s) if s else 0.0 for s in samples]
        lo = [m - min(s) if s else 0.0 for m, s in zip(med, samples, strict=True)]
        hi = [max(s) - m if s else 0.0 for m, s in zip(med, samples, strict=True)]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(unit)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)


def _draw(r: dict[str, Any], axes: Any) -> None:
    st = r["statements"]
    _bars(
        axes[0][0],
        [s["statement"] for s in st],
        [("agentdb helper", [s["agentdb"] for s in st]), ("raw asyncpg", [s["raw"] for s in st])],
        "1. Statement overhead (same SQL)",
        "statements/s",
    )
    names = list(dict.fromkeys(c["name"] for c in r["cycle"]))
    by = {key: c["tasks_per_s"] for key, c in by_name(r).items()}
    _bars(
        axes[0][1],
        names,
        [
            (f"{w} worker{'s' if w > 1 else ''}", [by.get((n, w), []) for n in names])
            for w in (1, 4)
        ],
        "2. Task cycle",
        "tasks/s (log)",
        log=True,
    )
    _bars(
        axes[1][0],
        [x["name"] for x in r["relay"]],
        [("rows/s", [x["rows_per_s"] for x in r["relay"]])],
        "3. Outbox relay",
        "rows/s",
    )
    sc = r["scaling"]
    _bars(
        axes[1][1],
        [f"{n:,} tasks" for n in sc["sizes"]],
        [
            ("p50", [sc["p50_ms"][str(n)] for n in sc["sizes"]]),
            ("p99", [sc["p99_ms"][str(n)] for n in sc["sizes"]]),
        ],
        "4. Claim latency",
        "ms",
    )


def _chart(r: dict[str, Any], path: Path) -> str | None:
    """Draw chart.png; return why not if matplotlib is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return f"no chart: matplotlib is not importable ({exc})"
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    _draw(r, axes)
    m = r["meta"]
    fig.suptitle(
        f"agentdb bench ({m['mode']}, {m['reps']} reps, "
        f"PostgreSQL {m['versions']['postgres'].split()[0]}, "
        f"{m['cpu_count']} cores) - medians, bars span min-max",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(r: dict[str, Any], out: Path) -> None:
    """Write chart.png, report.md and results.json to ``out``, print the report.

    A missing matplotlib is a note in the report, not an error.

    Raises:
        OSError: ``out`` cannot be created or written.
    """
    out.mkdir(parents=True, exist_ok=True)
    r["targets"] = targets(r)
    why = (
        _chart(r, out / "chart.png")
        if "statements" in r
        else "no chart: only agentdb against DBOS ran"
    )
    if why is not None:
        r["notes"].append(why)
    text = render(r)
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(r, indent=2) + "\n", encoding="utf-8")
    print(text, flush=True)
    print(
        f"\nwrote {out / 'report.md'}, {out / 'results.json'}"
        f"{'' if why else ', ' + str(out / 'chart.png')}"
    )
