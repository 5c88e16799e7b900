"""Load the runtime statements from ``agentdb/queries/*.sql`` (and ``agentdb/_citus/queries``).

Each statement starts with a header, sqlc-style::

    -- name: task_get :one
    -- Free text: what it does and why.
    -- guarantee: G7
    -- zero rows: what it means when nothing comes back.
    -- params: $1 tenant_id uuid, $2 id uuid

Cardinality is ``:one`` (at most one row; zero is what the ``zero rows`` line
says, more is a bug), ``:many`` (any number), ``:execrows`` (no result set;
the command status gives the row count). ``guarantee`` lists the ids of
:mod:`agentdb.guarantees` the statement upholds, or ``none`` for a read-only
diagnostic. The loader refuses at import: a missing or unknown tag, a
duplicate name, a ``params`` list that does not match the highest ``$n`` in
the SQL, a ``:one``/``:execrows`` statement without a ``zero rows`` line. The
SQL text is static; nothing is interpolated. Callers pass parameters by
their declared names (:meth:`Query.bind`), so a reordered ``$n`` is a loud
error instead of a silent swap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

__all__ = ["CARDINALITIES", "Param", "Query", "QueryFileError", "load", "parse"]

CARDINALITIES = frozenset({":one", ":many", ":execrows"})

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*) (:[a-z]+)\s*$")
_FIELD = re.compile(r"^-- (guarantee|zero rows|params): (.*)$")
_PARAM = re.compile(r"^\$(\d+) ([a-z_][a-z0-9_]*) ([a-z0-9_\[\]]+)$")
_PLACEHOLDER = re.compile(r"\$(\d+)")


class QueryFileError(ValueError):
    """A statement file is malformed (raised at import time)."""


@dataclass(frozen=True, slots=True)
class Param:
    position: int
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class Query:
    """One static statement with its declared contract."""

    name: str
    cardinality: str
    sql: LiteralString
    params: tuple[Param, ...]
    guarantees: tuple[str, ...]
    zero_rows: str
    doc: str
    source: str

    @property
    def names(self) -> tuple[str, ...]:
        """The parameter names, in ``$n`` order."""
        return tuple(p.name for p in self.params)

    def bind(self, values: dict[str, Any]) -> tuple[Any, ...]:
        """Order ``values`` by the declared parameter names, for ``$1``, ``$2``, ...

        Raises:
            TypeError: a declared parameter is missing or an unknown one is given (a bug
                in the caller, as with a wrong keyword argument).
        """
        try:
            args = tuple(values[p.name] for p in self.params)
        except KeyError:
            args = ()
        if len(values) != len(args) or len(args) != len(self.params):
            declared = set(self.names)
            missing = sorted(declared - values.keys())
            extra = sorted(values.keys() - declared)
            raise TypeError(
                f"{self.name}: missing parameter(s) {missing}, unknown parameter(s) {extra}"
            )
        return args


def _parse_params(text: str, where: str) -> tuple[Param, ...]:
    if text.strip() == "none":
        return ()
    params: list[Param] = []
    for i, chunk in enumerate(text.split(","), start=1):
        m = _PARAM.match(chunk.strip())
        if m is None or int(m.group(1)) != i:
            raise QueryFileError(f"{where}: malformed params entry {chunk.strip()!r}")
        params.append(Param(i, m.group(2), m.group(3)))
    return tuple(params)


def _one(block: list[str], source: str) -> Query:
    m = _NAME.match(block[0])
    if m is None:
        raise QueryFileError(f"{source}: expected '-- name: <name> <:tag>', got {block[0]!r}")
    name, tag = m.groups()
    where = f"{source}:{name}"
    if tag not in CARDINALITIES:
        raise QueryFileError(f"{where}: unknown cardinality {tag}")
    fields: dict[str, str] = {}
    doc: list[str] = []
    body_start = len(block)
    for i, line in enumerate(block[1:], start=1):
        if not line.startswith("--"):
            body_start = i
            break
        f = _FIELD.match(line)
        if f is not None:
            key = f.group(1)
            fields[key] = (fields[key] + " " + f.group(2)) if key in fields else f.group(2)
        else:
            doc.append(line[2:].strip())
    sql = "\n".join(block[body_start:]).strip().rstrip(";").strip()
    if not sql:
        raise QueryFileError(f"{where}: no SQL after the header")
    if "params" not in fields:
        raise QueryFileError(f"{where}: missing '-- params:' line (write 'none' if there are none)")
    if "guarantee" not in fields or not re.fullmatch(r"none|G\d+(, G\d+)*", fields["guarantee"]):
        raise QueryFileError(f"{where}: missing or malformed '-- guarantee: G<n>' line")
    if tag in (":one", ":execrows") and "zero rows" not in fields:
        raise QueryFileError(f"{where}: {tag} statements must say what zero rows means")
    params = _parse_params(fields["params"], where)
    highest = max((int(n) for n in _PLACEHOLDER.findall(sql)), default=0)
    if highest != len(params):
        raise QueryFileError(f"{where}: SQL uses ${highest} but params declares {len(params)}")
    return Query(
        name=name,
        cardinality=tag,
        # Static text from a file shipped with the package, never built from values.
        sql=sql,
        params=params,
        guarantees=() if fields["guarantee"] == "none" else tuple(fields["guarantee"].split(", ")),
        zero_rows=fields.get("zero rows", ""),
        doc=" ".join(doc).strip(),
        source=source,
    )


def parse(text: str, source: str) -> list[Query]:
    """Parse one statement file into queries."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        elif line.strip() and not line.startswith("--"):
            raise QueryFileError(f"{source}: SQL before the first '-- name:' header")
    return [_one(block, source) for block in blocks]


def load(*folders: Path) -> dict[str, dict[str, Query]]:
    """Load every ``*.sql`` file in ``folders``, by file stem; stems and names are unique."""
    files: dict[str, dict[str, Query]] = {}
    seen: set[str] = set()
    for path in sorted(p for folder in folders for p in folder.glob("*.sql")):
        if path.stem in files:
            raise QueryFileError(f"{path.name}: two statement files named {path.stem}")
        found: dict[str, Query] = {}
        for q in parse(path.read_text(encoding="utf-8"), path.name):
            if q.name in seen:
                raise QueryFileError(f"{path.name}: duplicate statement name {q.name}")
            seen.add(q.name)
            found[q.name] = q
        files[path.stem] = found
    return files
