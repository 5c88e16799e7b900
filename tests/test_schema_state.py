"""The schema the migrations make, held against two records of it.

* ``tests/baseline/catalogue.json`` froze the catalogue of a database
  migrated by the migrations as they were before the squash (0001-0029,
  made by ``python -m dev.schema_state baseline``): every table
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
from dev import schema_state
from tests import _pg

pytestmark = pytest.mark.plain_postgres("the catalogue and schema.sql are plain Postgres's")

BASELINE = Path(__file__).resolve().parent / "baseline" / "catalogue.json"
#: The newest migration the squash covers: later ones change the schema on purpose
#: (they regenerate sql/schema.sql), so the comparison rolls them back first.
SQUASHED = "0012.citus"
#: A routine whose name ends in a migration number: a layer's leftover.
_LAYER = re.compile(r"_\d{4}\(")
#: Routines of the layers that the squash drops, and why nothing misses them.
REMOVED: dict[str, str] = {
    **{
        f"agentdb_distribute_{part}()": "one step of the layered agentdb_distribute (and the "
        "call a layer made on an install distributed already), folded into it"
        for part in ("signals", "children", "wait_rules", "schedules", "steps")
    },
    "agentdb_purge_signals(p_tenant uuid, p_kind text, p_older_than interval)": "called only "
    "by a layer of agentdb_purge / agentdb_purge_tenant, and only ever for a kind ('tasks') "
    "another layer had taken before it: it deleted nothing",
}
#: Routines defined once now whose code resolves a chain of layers (wrappers
#: calling ``*_00NN`` bodies): the same behaviour, another text. Every other
#: routine's code is the layers' own (its comments may differ).
RESOLVED: dict[str, str] = {
    "agentdb_grant_roles": "four layers (0012, 0014, 0020, 0029) in one body; it ends by "
    "restoring the caller's client_min_messages, where the outer layer set 'notice'",
    "agentdb_delete_tenant": "four layers (0012, 0014, 0020, 0029): the same deletes in the "
    "same order, the same rows reported in the same order",
    "agentdb_purge": "six layers (0010, 0014, 0020, 0021, 0022, 0028): each class reaches the "
    "statement its layer ran, after the same checks, in the same order",
    "agentdb_purge_tenant": "the same six layers, for one tenant",
    "agentdb_distribute": "nine layers (0013-0029) and their helpers: the same steps in the "
    "same order, less a second trigger pause that found every trigger paused already",
    "agentdb_partition_events": "its transient sequence is agent_events_id_seq_by_month, "
    "not agent_events_id_seq_0028 (renamed to agent_events_id_seq before it commits)",
    "agentdb_unpartition_events": "its transient sequence is agent_events_id_seq_one_table, "
    "not agent_events_id_seq_0027 (renamed the same way)",
    "agentdb_schema_version": "it names the squashed baseline's newest migration",
}


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


def test_no_routine_is_named_for_a_migration(pg_server: _pg.Server) -> None:
    """No ``*_00NN`` routine: each is defined once, under its own name."""
    with schema_state.fresh_database(pg_server.admin_dsn) as url:
        migrate.migrate(url, events_by_month=True, notify=lambda _line: None)
        routines = schema_state.catalogue(url)["routines"]
    assert [s for s in routines if _LAYER.search(s)] == []
    assert len(routines) >= 50  # not vacuous


def test_the_exceptions_name_what_the_baseline_has() -> None:
    """REMOVED and RESOLVED name routines the layers had (a typo would excuse nothing)."""
    frozen = json.loads(BASELINE.read_text(encoding="utf-8"))["plain"]["routines"]
    assert set(REMOVED) <= set(frozen)
    assert set(RESOLVED) <= {s.split("(")[0] for s in frozen}


def test_sql_schema_file_is_what_the_migrations_make(pg_server: _pg.Server) -> None:
    expected = schema_state.migrated_schema_sql(pg_server.admin_dsn)
    written = schema_state.SCHEMA_FILE.read_text(encoding="utf-8")
    assert written == expected, "sql/schema.sql is stale: run `make schema`"
