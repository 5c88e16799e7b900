"""``agentdb bench --quick`` runs to the end and reports sane numbers.

A benchmark, not a test of speed: nothing here compares a number with a
threshold. It checks that the run completes on the test server, writes its
report, chart and results, reports only positive, finite measurements, and
drops the databases it created.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentdb.tools.bench import runner
from agentdb.tools.bench import targets as targets_mod
from agentdb.tools.bench.command import main
from agentdb.tools.cli import build_parser
from tests import _pg

#: The measured series in results.json: every value must be a positive, finite number.
_SERIES = {
    "statements": ("agentdb", "raw"),
    "cycle": ("tasks_per_s",),
    "relay": ("rows_per_s",),
}


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


def test_bench_is_an_agentdb_subcommand() -> None:
    args = build_parser().parse_args(["bench", "--quick", "--reps", "2", "--skip-1m"])
    assert (args.quick, args.reps, args.skip_1m, args.out) == (True, 2, True, Path("bench-results"))


def test_the_dbos_only_and_wal_breakdown_switches() -> None:
    parser = build_parser()
    assert parser.parse_args(["bench"]).only == "all"
    assert parser.parse_args(["bench", "--dbos-only"]).only == "dbos"
    assert parser.parse_args(["bench", "--wal-breakdown", "--quick"]).only == "wal"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--dbos-only", "--wal-breakdown"])


def test_history_runs_units_first_and_says_so_in_the_report() -> None:
    from agentdb.tools.bench.versus_report import versus_section

    parser = build_parser()
    assert parser.parse_args(["bench", "--wal-breakdown"]).history == 0
    assert parser.parse_args(["bench", "--wal-breakdown", "--history", "500"]).history == 500
    section = {"workers": 4, "concurrency": 10, "poll_ms": 50.0, "wal_per_database": True,
               "rows": [], "ratios": []}  # fmt: skip
    said = "\n".join(versus_section({"versus": {**section, "history": 20_000}}))
    assert "each side ran 20,000 single-effect units first" in said
    assert "CHECKPOINT ran before each measured run" in said
    assert "History" not in "\n".join(versus_section({"versus": {**section, "history": 0}}))


def test_the_warm_up_is_left_out_and_the_report_says_so() -> None:
    # A run warms its processes with another tenant's units: the quick bench's
    # counts (_check_versus: every row error-free, so each side finished exactly
    # its measured units) show they stay out of the figures; this shows the
    # report says it happened, and says nothing when it did not.
    from agentdb.tools.bench.harness import FULL, QUICK
    from agentdb.tools.bench.versus_report import versus_section

    assert FULL.versus_warmup > 0
    assert QUICK.versus_warmup > 0
    section = {"workers": 4, "concurrency": 10, "poll_ms": 50.0, "wal_per_database": True,
               "rows": [], "ratios": [], "history": 0}  # fmt: skip
    said = "\n".join(versus_section({"versus": {**section, "warmup": 200}}))
    assert "first drove 200 units of the same workload for another tenant" in said
    assert "Warm-up" not in "\n".join(versus_section({"versus": {**section, "warmup": 0}}))


# Lines as pg_waldump 15 prints them: database 16384 is measured, 16999 is another.
_WALDUMP = """\
rmgr: Heap        len (rec/tot):     54/   198, tx:        735, lsn: 0/0153D9B8, prev 0/0153D980, desc: INSERT off 5 flags 0x00, blkref #0: rel 1663/16384/16385 blk 0 FPW
rmgr: Btree       len (rec/tot):     64/    64, tx:        735, lsn: 0/0153DA80, prev 0/0153D9B8, desc: INSERT_LEAF off 2, blkref #0: rel 1663/16384/16390 blk 1
rmgr: Transaction len (rec/tot):     34/    34, tx:        735, lsn: 0/0153DAC0, prev 0/0153DA80, desc: COMMIT 2026-12-06 02:00:00.000000 UTC
rmgr: Heap        len (rec/tot):     54/    54, tx:        736, lsn: 0/0153DAE8, prev 0/0153DAC0, desc: INSERT off 6 flags 0x00, blkref #0: rel 1663/16999/16385 blk 0
rmgr: Transaction len (rec/tot):     34/    34, tx:        736, lsn: 0/0153DB20, prev 0/0153DAE8, desc: COMMIT 2026-12-06 02:00:00.000001 UTC
rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/0153DB48, prev 0/0153DB20, desc: RUNNING_XACTS nextXid 737 latestCompletedXid 736 oldestRunningXid 737
rmgr: Heap2       len (rec/tot):     59/  8255, tx:          0, lsn: 0/0153DB80, prev 0/0153DB48, desc: PRUNE latestRemovedXid 700 nredirected 0 ndead 1, blkref #0: rel 1663/16384/16385 blk 3 FPW
pg_waldump: error: error in WAL record at 0/0153FBD8: invalid record length at 0/0153FC10
"""  # noqa: E501


def test_wal_of_one_database_from_pg_waldump_lines() -> None:
    from agentdb.tools.bench.walstats import parse, usage

    records = list(parse(_WALDUMP.splitlines()))
    assert len(records) == 7
    wal = usage(records, 16384)
    # Its two block records and its transaction's commit, and the prune of its page; not the
    # other database's insert or commit, nor the cluster-wide snapshot.
    assert (wal.records, wal.bytes, wal.fpi_bytes) == (4, 198 + 64 + 34 + 8255, 144 + 8196)
    assert wal.by_filenode == {16385: [2, 198 + 8255, 144 + 8196], 16390: [1, 64, 0], 0: [1, 34, 0]}
    assert set(wal.by_type) == {"Heap/INSERT", "Btree/INSERT_LEAF", "Transaction/COMMIT",
                                "Heap2/PRUNE"}  # fmt: skip
    wal.names[16385] = "agent_tasks"
    per = wal.as_json(2)
    assert per["bytes_per_unit"] == wal.bytes / 2
    assert per["by_relation"][0]["name"] == "agent_tasks"  # type: ignore[index]
    assert usage(records, 16999).bytes == 54 + 34


def test_the_command_module_stays_light() -> None:
    # `agentdb --help` imports every command module: the benchmark itself
    # (its modules, the peers, matplotlib) must load only when it runs.
    probe = (
        "import sys, agentdb.tools.bench.command; "
        "print(sorted(m for m in sys.modules if m.startswith(('agentdb.tools.bench.', "
        "'pgqueuer', 'procrastinate', 'dbos', 'matplotlib'))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.strip() == "['agentdb.tools.bench.command']"


def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--dsn", "mysql://localhost/x"]) == 2
    assert main(["--quick", "--reps", "0", "--dsn", "postgresql://localhost/x"]) == 2
    assert main(["--quick", "--history", "-1", "--dsn", "postgresql://localhost/x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3
    assert all(line.startswith("agentdb bench: ") for line in err)


def test_an_unreachable_server_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--dsn", "postgresql://u:secret@127.0.0.1:1/x"]) == 1
    [err] = capsys.readouterr().err.splitlines()
    assert err.startswith("agentdb bench: cannot connect to postgresql://u:***@127.0.0.1:1/x")


@pytest.mark.timeout(900)  # the run's own limit below: 251 s here on a loaded 2-core box
def test_quick_bench_completes_with_sane_numbers(pg_server: _pg.Server, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "agentdb.tools.bench", "--quick", "--dsn", pg_server.admin_dsn]
    run = subprocess.run(
        [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=900, check=False
    )
    assert run.returncode == 0, run.stderr[-4000:]

    report = (out / "report.md").read_text()
    for heading in ("Statement overhead", "Task cycle", "Outbox relay", "Scaling", "Pickup",
                    "held snapshot", "Targets"):  # fmt: skip
        assert heading in report, heading
    assert "## 1. Statement overhead" in run.stdout  # the table is printed too
    assert not re.search(r"\b(nan|inf)\b", report, flags=re.IGNORECASE)

    results = json.loads((out / "results.json").read_text())
    for section, keys in _SERIES.items():
        assert results[section], section
        for row in results[section]:
            for key in keys:
                assert row[key], (section, key)
                assert all(math.isfinite(v) and v > 0 for v in row[key]), (section, row)
    scaling = results["scaling"]
    assert len(scaling["sizes"]) == 2
    for series in (scaling["p50_ms"], scaling["p99_ms"]):
        assert all(math.isfinite(v) and v > 0 for v in _numbers(series))
    assert "agent_tasks" in scaling["explain"]
    # Everything else measured (CPU, WAL, ratios' inputs) is finite and not negative.
    for section in ("statements", "cycle", "relay", "scaling"):
        assert all(math.isfinite(v) and v >= 0 for v in _numbers(results[section])), section

    _check_workers_and_snapshot(results, report)
    _check_versus(results, report)
    _check_targets(results, report, run.stderr)

    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # the bench says why there is no chart instead of failing
        assert "no chart: matplotlib is not importable" in report

    # The run dropped every database it created.
    with _pg.admin(pg_server.admin_dsn) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)",
            (results["meta"]["databases"],),
        ).fetchall()
    assert results["meta"]["databases"]
    assert left == []


def _check_workers_and_snapshot(results: dict[str, Any], report: str) -> None:
    # Real `agentdb worker` processes drained every task, with their own CPU measured.
    workers = [c for c in results["cycle"] if c["kind"] == "agentdb-worker"]
    assert {(c["name"], c["workers"]) for c in workers} == {
        (name, w) for name in (targets_mod.WORKER_10, targets_mod.WORKER_100) for w in (1, 4)
    }
    for c in workers:
        assert not c["errors"], c
        assert all(v > 0 for v in c["client_cpu_us_per_task"]), c
    # Pickup: every task of both modes reached a real worker's handler, timed.
    pickup = results["pickup"]
    for mode in ("listen", "poll"):
        assert len(pickup[mode]["ms"]) == pickup["samples"] > 0, mode
        assert all(math.isfinite(v) and v > 0 for v in pickup[mode]["ms"]), mode
    assert "## 5. Pickup latency" in report
    # The held snapshot: both runs finished work, their claims timed, their bloat read.
    snap = results["snapshot"]
    for one in (snap["free"], snap["held"]):
        assert one["created"] > 0, one
        assert one["tasks_per_s"] > 0, one
        assert 0 < one["claim_p99_ms"] < math.inf, one
        assert set(one["dead_rows_added"]) == {"agent_tasks", "agent_operations", "agent_outbox"}
    assert (snap["free"]["held"], snap["held"]["held"]) == (False, True)
    # Nothing the held run replaced could be pruned: its dead task versions are all there.
    assert snap["held"]["dead_rows_added"]["agent_tasks"] > 0, snap
    assert math.isfinite(snap["loss_pct"])
    assert "## 5b. Throughput under a held snapshot" in report


def _check_versus(results: dict[str, Any], report: str) -> None:
    # agentdb against DBOS: both sides ran both workloads to the end, each in its database.
    if importlib.util.find_spec("dbos") is not None:
        versus = results["versus"]
        got = {(x["side"], x["workload"]) for x in versus["rows"]}
        assert got == {(s, w) for s in ("agentdb", "dbos") for w in ("unit", "agent_run")}
        for x in versus["rows"]:
            assert not x["errors"], x
            assert len(x["units_per_s"]) == results["meta"]["reps"], x
            for key in ("units_per_s", "wal_bytes_per_unit", "p50_ms", "p95_ms"):
                assert all(math.isfinite(v) and v > 0 for v in x[key]), (key, x)
            if versus["wal_per_database"]:
                assert x["breakdown"]["by_relation"], x
        assert {r["metric"] for r in versus["ratios"]} >= {"units/s", "WAL bytes/unit"}
        assert versus["warmup"] > 0
        assert "## 7. agentdb against DBOS" in report
        assert "**Warm-up**" in report
        assert "What each side guarantees that the other does not" in report


def _check_targets(results: dict[str, Any], report: str, stderr: str) -> None:
    # The targets, as data: each measured one carries its verdict, and the report renders
    # every one of them; the run said on stderr which section it was in.
    targets = results["targets"]
    assert {t["name"] for t in targets} >= {"agentdb Relay.drain() ÷ raw one-statement drain"}
    for t in targets:
        assert set(t) >= {"name", "measured", "goal", "met"}, t
        assert t["name"] in report, t["name"]
        if t["measured"] is None or t["goal"] is None:
            assert t["met"] is None, t
        else:
            assert math.isfinite(t["measured"]), t
            better = t["measured"] >= t["goal"] if t["higher_is_better"] else (
                t["measured"] <= t["goal"])  # fmt: skip
            assert t["met"] is better, t
    names = {t["name"] for t in targets}
    assert "throughput lost under a snapshot held for 5 s" in names
    for n, phase in enumerate(runner._PHASES, 1):
        assert f"agentdb bench: [{n}/{len(runner._PHASES)}] {phase} ..." in stderr
    assert "agentdb bench: scaling with tenants: done in" in stderr


def test_the_warm_up_tenant_sorts_before_the_measured_one() -> None:
    """Its rows then never sit after the measured tenant's in a tenant-leading index, so
    the measured rows are always inserted at the index's end (WAL of page splits: see
    warm_tenant_id); a tenant id is random, so the rule is checked over many draws."""
    from agentdb.tools.bench.versus import warm_tenant_id

    for measured in [uuid.uuid4() for _ in range(500)] + [uuid.UUID(int=1)]:
        assert warm_tenant_id(measured) < measured
