"""``make mutate``: apply each mutant to a scratch copy and run the tests that must kill it.

    python -m dev.mutate [--jobs 2] [--only ID,ID] [--dsn URL] [--list]
    python -m dev.mutate --generated [--sample N] [--seed S] [--jobs 1] [--list]

Needs a checkout (it copies ``agentdb/``, ``dev/``, ``docs/``, ``sql/``, ``tests/``, ``examples/``
and ``pyproject.toml`` into scratch directories) and a Postgres the tests can
create databases on: ``--dsn`` / ``AGENTDB_TEST_DSN``, else an embedded one
started for the run. Each mutant is one exact edit of one file; the targeted
tests run against the mutated copy (``PYTHONPATH`` points at it, so SQL,
migrations and Python alike come from the copy). A mutant is killed when its
tests fail; it survives when they pass. Declared equivalent mutants are run
too, so the report shows the claim holds. Exit status 0 when every
non-equivalent mutant was killed and the unmutated baseline passed.

Each mutant's tests get ``--timeout`` seconds (a mutant can make a query loop
for ever: a recursive walk that never ends). A run over its time is killed -
the report counts it as killed, by timeout, apart - and so is what it left
behind: its pytest process tree (its own session: pgbouncer, workers, CLIs),
and the sessions those processes held on the server, found by their client
ports and ended with ``pg_terminate_backend`` (a backend whose client died goes
on running its query), and the test databases they were in; all before the
next mutant starts.

``--generated`` runs the mechanical SQL mutants of generate.py instead of the
hand catalogue (all of them, or a seeded sample of ``--sample N``: the same
seed picks the same mutants); its report goes to ``mutation-results/generated``.

Killers first. ``dev/mutate/killers.txt`` names, per mutant, the test that
killed it in an earlier run. That test runs alone first, on the mutated copy:
when it fails the mutant is killed, in seconds, where the whole of its test
files takes half a minute (with ``-x`` a run stops at its first failure, but
the killing test is often late in its file). When it passes - the test or the
code changed - the mutant's tests run as before. The baseline runs each
mutant's killer, or its tests when it has none, unmutated; a kill by a test
the baseline did not run is checked by running that test unmutated too, and
is an error when it fails there as well. ``--record`` writes the killers this
run found back into the file (a test, not a verdict: every run still runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from agentdb.tools._common import CITUS_ENV, ON_CITUS_ENV
from dev.mutate.catalogue import Mutant, Unanchored, all_mutants, apply, locate
from dev.mutate.generate import generated_mutants, sample

__all__ = ["Outcome", "check_catalogue", "main"]

# docs/: some suites a mutant's tests name read it (test_status checks the Operating page).
_COPIED = ("agentdb", "dev", "docs", "sql", "tests", "examples", "pyproject.toml", "README.md")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")
_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors)")
_TIMED_OUT = -1  # _pytest's exit code for a run that ran out of time
_GONE_WITHIN = 20.0  # seconds to wait for the ended sessions to be gone
_TEST_DATABASE = "agentdb_t_"  # the prefix of the testing kit's databases
# pytest -q's short summary: "FAILED tests/x.py::test_y - AssertionError ..." (or ERROR).
# A node id may hold spaces (a parameter such as "every tenant"): up to " - " or the end.
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S.*?)(?: - .*)?$", re.MULTILINE)
#: Which test killed each mutant last time (`id: node id`, one a line), tried first.
KILLERS = Path(__file__).with_name("killers.txt")


@dataclass(frozen=True)
class Outcome:
    id: str
    verdict: str  # killed | timeout | survived | equivalent | equivalent-killed | error
    seconds: float
    detail: str
    killer: str = ""  # the test that failed, when one did


def read_killers(path: Path = KILLERS) -> dict[str, str]:
    """``{mutant id: test node id}`` from a killers file (none when it is missing)."""
    if not path.is_file():
        return {}
    found: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        mutant, sep, test = line.partition(": ")
        if not sep or not test.strip() or "::" not in test:
            raise ValueError(f"{path}:{n}: not `mutant id: tests/file.py::test`: {line!r}")
        found[mutant.strip()] = test.strip()
    return found


def read_ids(path: Path) -> list[str]:
    """The mutant ids a file lists, one a line (``#`` starts a comment).

    Raises:
        OSError: the file cannot be read.
        ValueError: it lists no id, or one twice.
    """
    ids = [ln.split("#", 1)[0].strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    ids = [i for i in ids if i]
    if not ids:
        raise ValueError(f"{path}: no mutant ids")
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"{path}: listed twice: {', '.join(twice)}")
    return ids


def write_killers(found: dict[str, str], path: Path = KILLERS) -> None:
    """Merge ``found`` into the killers file, sorted by mutant id."""
    merged = {**read_killers(path), **found}
    head = (
        "# The test that killed each mutant when it last ran (python -m dev.mutate --record):\n"
        "# tried alone first, then the mutant's own tests when it passes. `id: node id`.\n"
    )
    body = "".join(f"{k}: {v}\n" for k, v in sorted(merged.items()))
    path.write_text(head + body, encoding="utf-8")


def failed_test(output: str) -> str:
    """The node id of the first test pytest -q reports FAILED or ERROR ('' when none)."""
    found = _FAILED.search(output)
    return found.group(1) if found else ""


def _root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "tests").is_dir() or not (root / "sql").is_dir():
        raise SystemExit("agentdb mutate: run it from a checkout (tests/ and sql/ are needed)")
    return root


def check_catalogue(root: Path, mutants: Sequence[Mutant]) -> list[str]:
    """Problems with the catalogue itself: an edit that does not apply exactly once."""
    problems = []
    seen: set[str] = set()
    for m in mutants:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        try:
            locate(root, m)
        except Unanchored as e:
            problems.append(str(e))
        if m.find == m.replace:
            problems.append(f"{m.id}: the edit changes nothing")
        for target in m.tests:
            if not (root / target.split("::")[0]).is_file():
                problems.append(f"{m.id}: no test file {target}")
    return problems


def _scratch(root: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    for name in _COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=_IGNORED)
        elif src.exists():
            shutil.copy2(src, into / name)
    return into


def _pytest(
    copy: Path, dsn: str, targets: Sequence[str], timeout: float, citus: bool = False
) -> tuple[int, str, str]:
    """(exit code, last line, the test that failed or '') of one pytest run in ``copy``."""
    env = dict(os.environ, AGENTDB_TEST_DSN=dsn, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    env.pop("AGENTDB_FAULTS", None)
    env.pop(ON_CITUS_ENV, None)
    if citus:  # every test database on the cluster named by AGENTDB_CITUS_DSN
        env[ON_CITUS_ENV] = "1"
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *targets]
    # Its own session: on a timeout the whole tree is found, and killed, by it.
    proc = subprocess.Popen(
        cmd,
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        server = os.environ.get(CITUS_ENV, dsn) if citus else dsn
        left = _end_run(proc, server, drop=not citus)
        return _TIMED_OUT, f"timed out after {timeout:.0f}s; {left}", ""
    tail = (out + err).strip().splitlines()
    return proc.returncode, tail[-1] if tail else "", failed_test(out)


def _tree(root: int) -> set[int]:
    """The processes of ``root``'s session and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    found = {root}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp session ...": comm may hold blanks and parentheses.
        state_ppid_pgrp_sid = stat[stat.rindex(")") + 2 :].split()[:4]
        ppid, sid = int(state_ppid_pgrp_sid[1]), int(state_ppid_pgrp_sid[3])
        children.setdefault(ppid, []).append(int(entry.name))
        if sid == root:
            found.add(int(entry.name))
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _client_ports(pids: set[int]) -> set[int]:
    """The local TCP ports of the sockets ``pids`` hold: the ``client_port`` the server
    shows for their sessions (a host's port is one socket's at a time)."""
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(int(link[8:-1]))
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()  # sl local_address rem_address st ... uid timeout inode
                if len(fields) > 9 and int(fields[9]) in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _over_unix_socket(dsn: str) -> bool:
    """Whether ``dsn`` reaches its server over a Unix socket (a host that is a path)."""
    host = psycopg.conninfo.conninfo_to_dict(dsn).get("host") or ""
    return not host or str(host).startswith("/")


def _end_run(proc: subprocess.Popen[str], dsn: str, drop: bool = True) -> str:
    """Kill a test run that ran out of time, and end the server sessions it held."""
    pids = _tree(proc.pid)
    ports = _client_ports(pids)  # before the kill: then the sockets are gone
    sessions: list[tuple[int, object, str | None]] = []
    problem = ""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            sessions = conn.execute(
                "SELECT pid, backend_start, datname FROM pg_stat_activity"
                " WHERE client_port = ANY (%s) AND pid <> pg_backend_pid()",
                (sorted(ports),),
            ).fetchall()
    except psycopg.Error as exc:
        problem = f"; could not list its sessions: {exc}"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids - {proc.pid}:  # a descendant that left the session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # a pipe still held open: leave it
        proc.kill()
        proc.wait()
    if not sessions and _over_unix_socket(dsn):
        # A Unix socket has no client port, and Linux shows no socket's peer in
        # /proc: the run's sessions cannot be told from anyone else's.
        return (
            f"killed {len(pids)} process(es); sessions over a Unix socket cannot be told "
            f"apart, so none was ended{problem}"
        )
    if not sessions:
        return f"killed {len(pids)} process(es), no session left behind{problem}"
    try:
        ended, databases = _end_sessions(dsn, sessions, drop)
    except psycopg.Error as exc:
        return f"killed {len(pids)} process(es); ending its sessions failed: {exc}"
    dropped = f", dropped {databases} test database(s)" if databases else ""
    return f"killed {len(pids)} process(es), ended {ended} session(s) it left behind{dropped}"


def _end_sessions(
    dsn: str, sessions: list[tuple[int, object, str | None]], drop: bool
) -> tuple[int, int]:
    """pg_terminate_backend each session (a pid with its start: not a reused pid), wait
    until they are gone, then drop the testing kit's databases they were in."""
    pids = [s[0] for s in sessions]
    starts = [s[1] for s in sessions]
    same = (
        "FROM pg_stat_activity WHERE (pid, backend_start) IN"
        " (SELECT * FROM unnest(%s::integer[], %s::timestamptz[]))"
    )
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        ended = conn.execute(
            f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) {same}", (pids, starts)
        ).fetchone()
        deadline = time.monotonic() + _GONE_WITHIN
        while time.monotonic() < deadline:
            left = conn.execute(f"SELECT count(*) {same}", (pids, starts)).fetchone()
            if not left or not left[0]:
                break
            time.sleep(0.2)
        databases = sorted({s[2] for s in sessions if s[2] and s[2].startswith(_TEST_DATABASE)})
        for name in databases if drop else []:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    return (int(ended[0]) if ended else 0), (len(databases) if drop else 0)


def _judge(m: Mutant, code: int, last: str) -> tuple[str, str]:
    if code == 0:
        return ("equivalent" if m.equivalent else "survived"), last
    if code == _TIMED_OUT:  # killed, but counted apart: a hang, not a failed assertion
        return ("equivalent-killed" if m.equivalent else "timeout"), last
    if _killed(code, last):
        return ("equivalent-killed" if m.equivalent else "killed"), last
    return "error", f"pytest exit {code}: {last}"


def _killed(code: int, last: str) -> bool:
    return code == 1 or (code == 2 and "error" in last)


def _run_one(
    root: Path,
    copy: Path,
    m: Mutant,
    dsn: str,
    timeout: float,
    killer: str | None = None,
    baselined: frozenset[str] | None = None,
) -> Outcome:
    """Run ``m``'s killer alone first (when it has one that still exists), then, unless
    it failed, ``m``'s tests; a kill by a test outside ``baselined`` (the files and node
    ids the baseline ran; None when there was no baseline) is checked unmutated."""
    path, pristine, mutated = apply(root, m)
    target = copy / path
    target.write_text(mutated, encoding="utf-8")
    started = time.monotonic()
    try:
        code, last, failed = -2, "", ""
        if killer and (copy / killer.split("::")[0]).is_file():
            code, last, failed = _pytest(copy, dsn, [killer], timeout, m.citus)
            if _killed(code, last):
                last = f"{last} (its killer, {killer})"
        if not _killed(code, last):
            code, last, failed = _pytest(copy, dsn, m.tests, timeout, m.citus)
    finally:
        target.write_text(pristine, encoding="utf-8")
    verdict, detail = _judge(m, code, last)
    proven = baselined is None or failed in baselined or failed.split("::")[0] in baselined
    if _killed(code, last) and failed and not proven:
        # The baseline did not run this test unmutated: a test that fails without the
        # mutant too proves nothing about it.
        again, said, _ = _pytest(copy, dsn, [failed], timeout, m.citus)
        if again != 0:
            verdict, detail = "error", f"{failed} fails without the mutant too: {said}"
    return Outcome(m.id, verdict, time.monotonic() - started, detail, failed)


@contextlib.contextmanager
def _database(dsn: str | None) -> Iterator[str]:
    given = dsn or os.environ.get("AGENTDB_TEST_DSN")
    if given:
        yield given
        return
    from agentdb.tools.embedded import embedded_postgres

    print("mutate: starting an embedded Postgres ...", file=sys.stderr, flush=True)
    with embedded_postgres(migrate=False) as local:
        yield local


def _baseline_targets(copy: Path, mutants: Sequence[Mutant], killers: dict[str, str]) -> list[str]:
    """What the baseline runs unmutated: each mutant's killer, or its tests when it has
    none (or a killer whose file is gone)."""
    targets: set[str] = set()
    for m in mutants:
        killer = killers.get(m.id)
        if killer and (copy / killer.split("::")[0]).is_file():
            targets.add(killer)
        else:
            targets.update(m.tests)
    # A node id inside a file the baseline runs whole adds nothing: run the file once.
    whole = {t for t in targets if "::" not in t}
    return sorted(t for t in targets if "::" not in t or t.split("::")[0] not in whole)


def _baseline(
    root: Path, copy: Path, dsn: str, mutants: Sequence[Mutant], targets: Sequence[str]
) -> tuple[bool, str]:
    probe = subprocess.run(
        [sys.executable, "-c", "import agentdb; print(agentdb.__file__)"],
        cwd=copy,
        env=dict(os.environ, PYTHONPATH=str(copy)),
        capture_output=True,
        text=True,
        check=False,
    )
    if not probe.stdout.strip().startswith(str(copy)):
        return False, f"the scratch copy is not what gets imported ({probe.stdout.strip()})"
    code, last, _ = _pytest(copy, dsn, targets, 3600, citus=any(m.citus for m in mutants))
    return code == 0, last


def _report(outcomes: list[Outcome], mutants: Sequence[Mutant], wall: float, out: Path) -> str:
    by_id = {m.id: m for m in mutants}
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    real = [o for o in outcomes if not by_id[o.id].equivalent]
    timeouts = sum(o.verdict == "timeout" for o in real)
    killed = sum(o.verdict == "killed" for o in real) + timeouts
    lines = [
        "# agentdb mutation check",
        "",
        f"{len(outcomes)} mutants: {killed} of {len(real)} non-equivalent killed"
        f" ({100 * killed / max(1, len(real)):.0f}%; {timeouts} of them by timeout), "
        f"{counts.get('survived', 0)} survived, {counts.get('error', 0)} errors; "
        f"{sum(o.verdict.startswith('equivalent') for o in outcomes)} declared equivalent. "
        f"Wall time {wall:.0f}s.",
        "",
        "| mutant | verdict | seconds | what | tests / reason |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        m = by_id[o.id]
        why = m.equivalent if m.equivalent else ", ".join(m.tests)
        lines.append(f"| `{o.id}` | {o.verdict} | {o.seconds:.0f} | {m.what} | {why} |")
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text, encoding="utf-8")
    (out / "results.json").write_text(
        json.dumps({"wall_seconds": wall, "outcomes": [asdict(o) for o in outcomes]}, indent=2)
    )
    return text


def _select(args: argparse.Namespace) -> tuple[list[Mutant], int] | int:
    """The mutants this run runs and how many it leaves to the other kind (or an exit code)."""
    every = list(generated_mutants() if args.generated else all_mutants())
    mutants = [m for m in every if m.citus == args.citus]
    elsewhere = len(every) - len(mutants)
    if args.ids:
        try:
            listed = read_ids(args.ids)
        except (OSError, ValueError) as exc:
            print(f"agentdb mutate: {exc}", file=sys.stderr)
            return 2
        args.only = ",".join(listed)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.id for m in mutants}
        if unknown:
            print(
                f"agentdb mutate: unknown mutant(s) {', '.join(sorted(unknown))}", file=sys.stderr
            )
            return 2
        mutants = [m for m in every if m.id in wanted]
        if len({m.citus for m in mutants}) > 1:
            print("agentdb mutate: --only mixes Citus and plain mutants; run them apart")
            return 2
        if any(m.citus for m in mutants) and not os.environ.get(CITUS_ENV):
            print(f"agentdb mutate: Citus mutants need {CITUS_ENV}")
            return 2
        elsewhere = 0
    if args.sample is not None:
        mutants = sample(mutants, args.sample, args.seed)
    return mutants, elsewhere


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dev.mutate", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--only", help="comma-separated mutant ids")
    parser.add_argument(
        "--ids",
        type=Path,
        help="a file of mutant ids, one a line (# comments); as --only",
    )
    parser.add_argument("--dsn", help="Postgres for the tests (default: $AGENTDB_TEST_DSN)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant")
    parser.add_argument("--out", type=Path, help="report folder (default: mutation-results)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument(
        "--citus",
        action="store_true",
        help=f"the mutants of the Citus statements, their tests on ${CITUS_ENV}",
    )
    parser.add_argument(
        "--generated",
        action="store_true",
        help="the mechanical SQL mutants (dev/mutate/generate.py), not the hand catalogue",
    )
    parser.add_argument("--sample", type=int, help="run a seeded sample of this many mutants")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed (default 1)")
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"write the tests that killed mutants into {KILLERS.relative_to(KILLERS.parents[2])}",
    )
    parser.add_argument(
        "--no-killers", action="store_true", help="run every mutant's tests whole, no killer first"
    )
    return parser


def _run_all(
    root: Path, args: argparse.Namespace, mutants: Sequence[Mutant], killers: dict[str, str]
) -> dict[str, Outcome] | None:
    """Each mutant's outcome, or None when the unmutated baseline fails."""
    with tempfile.TemporaryDirectory(prefix="agentdb-mutate-") as tmp, _database(args.dsn) as dsn:
        copies = [_scratch(root, Path(tmp) / f"copy{i}") for i in range(max(1, args.jobs))]
        baselined: frozenset[str] | None = None
        if not args.no_baseline:
            targets = _baseline_targets(copies[0], mutants, killers)
            baselined = frozenset(targets)
            ok, last = _baseline(root, copies[0], dsn, mutants, targets)
            if not ok:
                print(f"agentdb mutate: the unmutated tests fail, so nothing is measured: {last}")
                return None
            print(f"mutate: baseline passes ({last})", file=sys.stderr, flush=True)
        todo: queue.Queue[Mutant] = queue.Queue()
        for m in mutants:
            todo.put(m)
        outcomes: dict[str, Outcome] = {}
        lock = threading.Lock()

        def work(copy: Path) -> None:
            while True:
                try:
                    m = todo.get_nowait()
                except queue.Empty:
                    return
                o = _run_one(root, copy, m, dsn, args.timeout, killers.get(m.id), baselined)
                with lock:
                    outcomes[m.id] = o
                    print(
                        f"mutate: [{len(outcomes)}/{len(mutants)}] {m.id}: {o.verdict}"
                        f" ({o.seconds:.0f}s) {o.detail}",
                        file=sys.stderr,
                        flush=True,
                    )

        threads = [threading.Thread(target=work, args=(c,)) for c in copies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path("mutation-results") / ("generated" if args.generated else "")
    root = _root()
    if args.citus and not os.environ.get(CITUS_ENV):
        print(f"agentdb mutate --citus: set {CITUS_ENV} to a Citus coordinator database")
        return 2
    selected = _select(args)
    if isinstance(selected, int):
        return selected
    mutants, elsewhere = selected
    problems = check_catalogue(root, mutants)
    if problems:
        print("agentdb mutate: the catalogue is broken:\n  " + "\n  ".join(problems))
        return 2
    if args.list:
        for m in mutants:
            flag = " (equivalent)" if m.equivalent else ""
            print(f"{m.id:45} {locate(root, m).path}{flag}")
        print(f"{len(mutants)} mutants")
        return 0
    try:
        killers = {} if args.no_killers else read_killers()
    except ValueError as exc:
        print(f"agentdb mutate: {exc}")
        return 2
    started = time.monotonic()
    outcomes = _run_all(root, args, mutants, killers)
    if outcomes is None:
        return 1
    ordered = [outcomes[m.id] for m in mutants]
    print(_report(ordered, mutants, time.monotonic() - started, args.out))
    if args.record:
        found = {o.id: o.killer for o in ordered if o.verdict in ("killed", "timeout") and o.killer}
        write_killers(found)
        print(f"mutate: {len(found)} killers recorded in {KILLERS}")
    if elsewhere:
        other = "plain" if args.citus else "Citus (make mutate-citus)"
        print(f"mutate: {elsewhere} {other} mutants not run by this run")
    bad = [o for o in ordered if o.verdict in ("survived", "error")]
    for o in bad:
        print(f"NOT KILLED: {o.id} ({o.verdict}): {o.detail}")
    return 1 if bad else 0
