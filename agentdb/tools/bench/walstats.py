"""WAL written by one database, read back with ``pg_waldump``: bytes by record type and relation.

``pg_current_wal_lsn()`` differences count every database on the server
(and, on a shared server, other people's). This module reads the records
themselves between two positions and keeps those of one database:

* a record with a block reference (``blkref #0: rel <spc>/<db>/<filenode>``)
  belongs to the database its blocks are in;
* a record with none (a commit, an abort, a standby lock) belongs to it when
  its transaction wrote there (its ``tx:`` also appears on one of its block
  records);
* what is left - checkpoints, running-transaction snapshots, other databases -
  is not counted.

Record sizes are ``pg_waldump``'s ``len (rec/tot)``: ``tot`` the whole
record, ``tot - rec`` its full-page images. Page headers and the alignment
padding between records are not in them (a few per cent more on disk).
Relations are named from their file nodes in the database itself
(``pg_filenode_relation``), so :func:`name_relations` must run before the
database is dropped.

Reading the server's ``pg_wal`` needs the server on this machine, a
``pg_waldump`` of its major version, and the right to read the directory (the
postgres user, or root); :class:`WalReader.open` says why not otherwise, and
the bench falls back to cluster-wide positions. A temporary physical
replication slot, held by the reader's connection over a measured run, keeps
its segments from being recycled by a checkpoint before they are read.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import LiteralString

from agentdb import _db

__all__ = ["WalReader", "WalUsage", "lsn", "name_relations", "parse", "usage"]

_LINE = re.compile(
    r"rmgr: (?P<rmgr>\S+)\s+len \(rec/tot\):\s*(?P<rec>\d+)/\s*(?P<tot>\d+), "
    r"tx:\s*(?P<xid>\d+), lsn: \S+, prev \S+, desc: (?P<desc>.*)$"
)
_BLKREF = re.compile(r"rel (\d+)/(\d+)/(\d+)")
_RELATION: LiteralString = """
SELECT n, r::text AS name,
       coalesce(c.relkind::text, '') AS kind,
       coalesce(t.relname::text, '') AS of_table
FROM unnest($1::oid[]) AS n
CROSS JOIN LATERAL (SELECT pg_filenode_relation(0, n) AS r) AS f
LEFT JOIN pg_class c ON c.oid = f.r
LEFT JOIN pg_index i ON i.indexrelid = f.r
LEFT JOIN pg_class t ON t.oid = i.indrelid
"""


def lsn(text: str) -> int:
    """A ``0/16B3748`` position as a byte offset."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def _lsn_text(pos: int) -> str:
    return f"{pos >> 32:X}/{pos & 0xFFFFFFFF:X}"


@dataclass(frozen=True, slots=True)
class Record:
    """One WAL record as ``pg_waldump`` prints it."""

    rmgr: str
    kind: str  # rm_identify: INSERT, HOT_UPDATE, INSERT_LEAF, COMMIT ...
    rec: int
    tot: int
    xid: int
    blocks: tuple[tuple[int, int], ...]  # (database, file node) of each block referenced

    @property
    def dbs(self) -> set[int]:
        """The databases its blocks are in (0: a shared catalog)."""
        return {db for db, _ in self.blocks}

    @property
    def fpi(self) -> int:
        """Bytes of full-page images (and block data) beyond the record proper."""
        return self.tot - self.rec


def parse(lines: Iterable[str]) -> Iterator[Record]:
    """The records in ``pg_waldump``'s output lines (anything else is skipped)."""
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None:
            continue
        desc = m["desc"]
        refs = _BLKREF.findall(desc[desc.find("blkref") :] if "blkref" in desc else "")
        yield Record(
            rmgr=m["rmgr"],
            kind=desc.split(" ", 1)[0].rstrip(";,") or "?",
            rec=int(m["rec"]),
            tot=int(m["tot"]),
            xid=int(m["xid"]),
            blocks=tuple((int(db), int(node)) for _, db, node in refs),
        )


@dataclass
class WalUsage:
    """One database's WAL over a window: totals, by record type, by relation (file node)."""

    records: int = 0
    bytes: int = 0
    fpi_bytes: int = 0
    #: ``rmgr/KIND`` -> [records, bytes, of which full-page images]
    by_type: dict[str, list[int]] = field(default_factory=dict)
    #: file node (0: no relation - commits and the like) -> [records, bytes, fpi bytes]
    by_filenode: dict[int, list[int]] = field(default_factory=dict)
    #: file node -> relation name, once :func:`name_relations` ran
    names: dict[int, str] = field(default_factory=dict)

    def add(self, r: Record, node: int) -> None:
        self.records += 1
        self.bytes += r.tot
        self.fpi_bytes += r.fpi
        for row in (self.by_type.setdefault(f"{r.rmgr}/{r.kind}", [0, 0, 0]),
                    self.by_filenode.setdefault(node, [0, 0, 0])):  # fmt: skip
            row[0] += 1
            row[1] += r.tot
            row[2] += r.fpi

    def by_relation(self) -> dict[str, list[int]]:
        """:attr:`by_filenode` keyed by relation name (file nodes nobody names stay numbers)."""
        out: dict[str, list[int]] = {}
        for node, (n, b, f) in self.by_filenode.items():
            name = "(no relation: commits, aborts, locks)" if node == 0 else (
                self.names.get(node) or f"file node {node} (dropped or rewritten)")  # fmt: skip
            row = out.setdefault(name, [0, 0, 0])
            row[0] += n
            row[1] += b
            row[2] += f
        return out

    def as_json(self, units: int) -> dict[str, object]:
        """Per unit of work: totals and the two breakdowns, largest first."""
        per = max(1, units)

        def rows(table: dict[str, list[int]]) -> list[dict[str, object]]:
            ordered = sorted(table.items(), key=lambda kv: -kv[1][1])
            return [
                {"name": k, "records": n / per, "bytes": b / per, "fpi_bytes": f / per}
                for k, (n, b, f) in ordered
            ]

        return {
            "units": units,
            "records_per_unit": self.records / per,
            "bytes_per_unit": self.bytes / per,
            "fpi_bytes_per_unit": self.fpi_bytes / per,
            "by_type": rows(self.by_type),
            "by_relation": rows(self.by_relation()),
        }


def usage(records: Iterable[Record], db_oid: int) -> WalUsage:
    """The records of database ``db_oid``: its blocks', and its transactions' block-less ones."""
    out = WalUsage()
    ours: set[int] = set()
    loose: dict[int, list[Record]] = defaultdict(list)  # by xid, until the end
    for r in records:
        if db_oid in r.dbs:
            # Charged to its first block's relation (a heap update's new and old pages are
            # one relation; an index split's pages one index).
            out.add(r, next(node for db, node in r.blocks if db == db_oid))
            if r.xid:
                ours.add(r.xid)
        elif not r.dbs and r.xid:
            loose[r.xid].append(r)
    for xid in ours:
        for r in loose.get(xid, ()):
            out.add(r, 0)
    return out


async def name_relations(conn: _db.Conn, wal: WalUsage) -> None:
    """Name ``wal``'s file nodes from ``conn``'s database (index names say their table)."""
    nodes = [n for n in wal.by_filenode if n]
    if not nodes:
        return
    for row in await conn.fetch(_RELATION, nodes):
        if row["name"] is None:
            continue
        name = str(row["name"])
        if row["kind"] == "i" and row["of_table"]:
            name = f"{name} (index on {row['of_table']})"
        elif row["kind"] == "t":
            name = f"{name} (TOAST)"
        wal.names[int(row["n"])] = name


def _candidates(major: int) -> Iterator[str]:
    yield f"/usr/lib/postgresql/{major}/bin/pg_waldump"  # Debian, Ubuntu
    yield f"/usr/pgsql-{major}/bin/pg_waldump"  # Red Hat
    spec = importlib.util.find_spec("pgserver")  # the bench's embedded server's own
    for where in (spec.submodule_search_locations or []) if spec else []:
        yield str(Path(where) / "pginstall" / "bin" / "pg_waldump")
    found = shutil.which("pg_waldump")
    if found is not None:
        yield found


def _waldump(major: int) -> str | None:
    """A ``pg_waldump`` for server major version ``major``, or None."""
    for candidate in _candidates(major):
        if not os.access(candidate, os.X_OK):
            continue
        try:
            out = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
        except OSError:
            continue
        m = re.search(r"(\d+)", out.stdout)
        if m and int(m.group(1)) == major:
            return candidate
    return None


class WalReader:
    """Reads the server's WAL between two positions for one database at a time."""

    def __init__(self, conn: _db.Conn, binary: str, wal_dir: Path, timeline: int) -> None:
        self.conn = conn
        self.binary = binary
        self.wal_dir = wal_dir
        self.timeline = timeline
        self.slot: str | None = None

    @classmethod
    async def open(cls, admin_dsn: str) -> tuple[WalReader | None, str]:
        """A reader on ``admin_dsn``'s server, or None and why not.

        Raises:
            ConfigurationError, DatabaseUnavailable: as for :func:`agentdb._db.connect`.
        """
        conn = await _db.connect(admin_dsn)
        try:
            major = int(await conn.fetchval("SHOW server_version_num")) // 10000
            binary = _waldump(major)
            if binary is None:
                raise LookupError(f"no pg_waldump for PostgreSQL {major} on this machine")
            data = await conn.fetchval("SELECT current_setting('data_directory', true)")
            wal_dir = Path(str(data or "")) / "pg_wal"
            if not data or not os.access(wal_dir, os.R_OK | os.X_OK):
                raise LookupError(f"cannot read the server's WAL directory ({wal_dir})")
            timeline = int(await conn.fetchval("SELECT timeline_id FROM pg_control_checkpoint()"))
        except Exception as exc:
            await conn.close()
            return None, f"WAL per database is not measured ({exc}): WAL is cluster-wide"
        return cls(conn, binary, wal_dir, timeline), ""

    async def position(self) -> int:
        """The current WAL write position (reserving the WAL from here on, when it can)."""
        if self.slot is None:
            name = f"agentdb_bench_{uuid.uuid4().hex[:12]}"
            try:
                await self.conn.execute(
                    "SELECT pg_create_physical_replication_slot($1, true, true)", name
                )
                self.slot = name
            except Exception:  # no right, or no slots left: read soon instead
                self.slot = None
        return lsn(await self.conn.fetchval("SELECT pg_current_wal_lsn()::text"))

    async def release(self) -> None:
        """Let the server recycle the WAL :meth:`position` reserved."""
        if self.slot is not None:
            slot, self.slot = self.slot, None
            await self.conn.execute("SELECT pg_drop_replication_slot($1)", slot)

    def read(self, start: int, end: int) -> Iterator[Record]:
        """The records from ``start`` up to ``end`` (a record cut at ``end`` is left out).

        Raises:
            RuntimeError: ``pg_waldump`` printed nothing and failed (its message).
        """
        if end <= start:
            return
        cmd = [self.binary, "-p", str(self.wal_dir), "-t", str(self.timeline),
               "-s", _lsn_text(start), "-e", _lsn_text(end)]  # fmt: skip
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:  # fmt: skip
            assert proc.stdout is not None
            assert proc.stderr is not None
            seen = False
            for r in parse(proc.stdout):
                seen = True
                yield r
            err = proc.stderr.read()
        # It ends with an error at the last, incomplete record: only no records is a failure.
        if not seen and proc.returncode:
            raise RuntimeError(f"pg_waldump failed: {err.strip()[-500:]}")

    def database(self, db_oid: int, start: int, end: int) -> WalUsage:
        """Database ``db_oid``'s WAL between ``start`` and ``end``."""
        return usage(self.read(start, end), db_oid)

    async def close(self) -> None:
        await self.release()
        await self.conn.close()
