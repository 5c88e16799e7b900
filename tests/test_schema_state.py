"""The schema the migrations make, held against two records of it.

* ``tests/baseline/catalogue.json`` froze the catalogue of a database
  migrated by the migrations as they were before the squash (0001-0029,
  made by ``python -m agentdb.tools.schema_state baseline``): every table
  and column (type, default, nullability, order), constraint (name and
  definition), index, trigger, policy, grant, RLS flag, sequence and
  routine (signature, settings, grants, body), with one events table and
  with events by month. The squashed migrations must make exactly that -
  names included, since errors map on names - less the routines the
  layers left behind: every ``*_00NN`` one (a body kept under a migration
  number for its successor to call) and the few named below.
* ``sql/schema.sql`` (``make schema``) is the current state a reader opens
  first; it must be what the migrations make now.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentdb import migrate
from agentdb.tools import schema_state
from tests import _pg

pytestmark = pytest.mark.plain_postgres("the catalogue and schema.sql are plain Postgres's")

BASELINE = Path(__file__).resolve().parent / "baseline" / "catalogue.json"
#: The newest migration the squash covers: later ones change the schema on purpose
#: (they regenerate sql/schema.sql), so the comparison rolls them back first.
SQUASHED = "0029.steps"
#: A routine whose name ends in a migration number: a layer's leftover.
_LAYER = re.compile(r"_\d{4}\(")
#: Routines of the layers that the squash drops, and why nothing misses them.
REMOVED: dict[str, str] = {}
#: Routines defined once now whose code resolves a chain of layers (wrappers
#: calling ``*_00NN`` bodies): the same behaviour, another text. Every other
#: routine's code is the layers' own (its comments may differ).
RESOLVED: dict[str, str] = {}


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    state = copy.deepcopy(state)
    routines = state["routines"]
    for signature in list(routines):
        if _LAYER.search(signature) or signature in REMOVED:
            del routines[signature]
        elif signature.split("(")[0] in RESOLVED:
            routines[signature]["code_md5"] = "<resolved>"
    return state


def _migrated(server: _pg.Server, *, events_by_month: bool) -> dict[str, Any]:
    with schema_state.fresh_database(server.admin_dsn) as url:
        migrate.migrate(url, events_by_month=events_by_month, notify=lambda _line: None)
        ids = migrate.migration_ids()
        newer = len(ids) - 1 - ids.index(SQUASHED)
        if newer:
            migrate.rollback(url, count=newer)
        return schema_state.catalogue(url)


@pytest.mark.parametrize("layout", ["plain", "events_by_month"])
def test_the_squashed_migrations_make_the_schema_the_layers_made(
    pg_server: _pg.Server, layout: str
) -> None:
    frozen = json.loads(BASELINE.read_text(encoding="utf-8"))[layout]
    made = _migrated(pg_server, events_by_month=layout == "events_by_month")
    assert _comparable(made) == _comparable(frozen)


def test_the_exceptions_name_what_the_baseline_has() -> None:
    """REMOVED and RESOLVED name routines the layers had (a typo would excuse nothing)."""
    frozen = json.loads(BASELINE.read_text(encoding="utf-8"))["plain"]["routines"]
    assert set(REMOVED) <= set(frozen)
    assert set(RESOLVED) <= {s.split("(")[0] for s in frozen}
