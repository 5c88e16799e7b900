"""A recording fake provider with idempotency-key semantics, and the hooks a user's own fake needs.

:class:`RecordingProvider` stands in for a payment or email API in tests. It
keeps its ledger in the test database (``agentdb_testing.provider_calls``), not
in memory, because the crash matrix (:mod:`agentdb.testing.crash`) calls it
from worker *processes* that are SIGKILLed: what it saw must outlive them.

* every request is recorded on arrival ('received'), then the process may be
  killed there (:func:`at_provider_call`, fault point ``during_call``: the
  provider has the request, no effect yet);
* a request with an idempotency key whose effect already happened is answered
  from the key ('replayed', the first effect's reference, nothing new happens);
  any other request is an effect ('executed') - a request *without* a key always is.

Where it records: the pool of the enclosing :func:`recording` block (which
:func:`agentdb.testing.drain` opens for its handlers), else
``$AGENTDB_TESTING_DSN`` (which the crash matrix sets for its workers).

A fake of your own works with the crash matrix if it records where the parent
test can read it, calls :func:`at_provider_call` on arrival, tags what it
records with :func:`current_scenario`, and offers ``calls(db, scenario)``
returning :class:`ProviderCall` rows (see :class:`ProviderLedger`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from agentdb import _db, _faults
from agentdb.errors import ConfigurationError
from agentdb.models import Operation
from agentdb.worker import Reconciled

__all__ = [
    "INSTALL",
    "ProviderCall",
    "ProviderLedger",
    "RecordingProvider",
    "at_provider_call",
    "current_scenario",
    "install",
    "recording",
]

DSN_ENV = "AGENTDB_TESTING_DSN"
SCENARIO_ENV = "AGENTDB_TESTING_SCENARIO"

#: The ledger's tables; every role may write them (a worker may log in as the runtime role).
INSTALL = (
    "CREATE SCHEMA IF NOT EXISTS agentdb_testing",
    "CREATE TABLE IF NOT EXISTS agentdb_testing.provider_calls ("
    " id bigserial PRIMARY KEY, provider text NOT NULL, scenario text NOT NULL,"
    " action text NOT NULL, args jsonb NOT NULL, idempotency_key text,"
    " outcome text NOT NULL CHECK (outcome IN ('received', 'executed', 'replayed')),"
    " reference text, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "GRANT USAGE ON SCHEMA agentdb_testing TO PUBLIC",
    "GRANT SELECT, INSERT, UPDATE ON agentdb_testing.provider_calls TO PUBLIC",
    "GRANT USAGE ON SEQUENCE agentdb_testing.provider_calls_id_seq TO PUBLIC",
)

_RECEIVE = (
    "INSERT INTO agentdb_testing.provider_calls"
    " (provider, scenario, action, args, idempotency_key, outcome)"
    " VALUES ($1, $2, $3, $4::jsonb, $5, 'received') RETURNING id"
)
_LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
_EXECUTED_REF = (
    "SELECT reference FROM agentdb_testing.provider_calls WHERE provider = $1"
    " AND scenario = $2 AND idempotency_key = $3 AND outcome = 'executed'"
)
_SETTLE = "UPDATE agentdb_testing.provider_calls SET outcome = $2, reference = $3 WHERE id = $1"
_CALLS = (
    "SELECT action, args::text AS args, idempotency_key, outcome, reference, at"
    " FROM agentdb_testing.provider_calls WHERE provider = $1 AND scenario = $2 ORDER BY at, id"
)

_current: contextvars.ContextVar[_db.Pool | None] = contextvars.ContextVar(
    "agentdb_testing_pool", default=None
)


async def install(db: _db.Executor) -> None:
    """Create the recording provider's tables if they are missing (idempotent)."""
    async with _db.transaction(db) as conn:
        # Two sessions creating the same schema at once would collide in the catalog.
        await conn.execute(_LOCK_KEY, "agentdb_testing.install")
        for statement in INSTALL:
            await conn.execute(statement)


@contextlib.contextmanager
def recording(pool: _db.Pool) -> Iterator[None]:
    """Inside this block (and the tasks it starts) recording fakes write through ``pool``."""
    token = _current.set(pool)
    try:
        yield
    finally:
        _current.reset(token)


def current_scenario() -> str:
    """The crash-matrix scenario this process runs (``""`` outside the matrix)."""
    return os.environ.get(SCENARIO_ENV, "")


def at_provider_call() -> None:
    """Mark "the provider has the request, no effect yet": the crash matrix may SIGKILL here."""
    _faults.point("during_call")


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One request a fake provider received, as it recorded it."""

    action: str
    args: Mapping[str, Any]
    idempotency_key: str | None
    #: 'received' (its sender died first), 'executed' (an effect) or 'replayed' (from its key).
    outcome: str
    reference: str | None
    at: datetime

    def describe(self) -> str:
        key = "no key" if self.idempotency_key is None else f"key {self.idempotency_key!r}"
        return f"{self.action}({json.dumps(self.args, sort_keys=True)}, {key}) -> {self.outcome}"


class ProviderLedger(Protocol):
    """What the crash matrix reads from a fake provider: the calls of one scenario."""

    async def calls(self, db: _db.Executor, scenario: str = "") -> Sequence[ProviderCall]: ...


class RecordingProvider:
    """A fake provider that records every call and performs each idempotency key once.

    ``name`` keeps several fakes (``"payments"``, ``"email"``) apart in one ledger.
    """

    def __init__(self, name: str = "provider") -> None:
        self.name = name
        # One pool per event loop: a pool is bound to the loop that opened it.
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _db.Pool] = (
            weakref.WeakKeyDictionary()
        )

    async def _pool(self) -> _db.Pool:
        found = _current.get()
        if found is not None:
            return found
        dsn = os.environ.get(DSN_ENV)
        if not dsn:
            raise ConfigurationError(
                f"RecordingProvider {self.name!r} has nowhere to record: call it inside "
                f"agentdb.testing.drain(...) or recording(pool), or set ${DSN_ENV}"
            )
        loop = asyncio.get_running_loop()
        if loop not in self._pools:
            self._pools[loop] = await _db.create_pool(dsn, min_size=1, max_size=2)
        return self._pools[loop]

    async def call(
        self, action: str, args: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> str:
        """Perform ``action`` (once per ``idempotency_key``); return the provider's reference.

        Raises:
            ConfigurationError: there is nowhere to record (see the module docstring).
            DatabaseUnavailable: the ledger's database cannot be reached.
        """
        pool = await self._pool()
        scenario = current_scenario()
        request = await pool.fetchval(
            _RECEIVE, self.name, scenario, action, json.dumps(dict(args)), idempotency_key
        )
        at_provider_call()
        async with _db.transaction(pool) as conn:
            ref: str | None = None
            if idempotency_key is not None:
                # Serialise requests of one key: the second sees the first one's effect.
                await conn.execute(_LOCK_KEY, f"{self.name}/{scenario}/{idempotency_key}")
                ref = await conn.fetchval(_EXECUTED_REF, self.name, scenario, idempotency_key)
            if ref is None:
                ref = f"{action}_{uuid.uuid4().hex[:12]}"
                await conn.execute(_SETTLE, request, "executed", ref)
            else:
                await conn.execute(_SETTLE, request, "replayed", ref)
        return ref

    async def lookup(self, op: Operation) -> Reconciled | None:
        """A reconcile hook: did an effect happen for ``op``'s idempotency key?

        Register it for each action that calls this provider with the key
        (``reconcilers={"charge": psp.lookup}``); ``None`` means no effect happened.

        Raises:
            ConfigurationError, DatabaseUnavailable: as for :meth:`call`.
        """
        pool = await self._pool()
        ref = await pool.fetchval(_EXECUTED_REF, self.name, current_scenario(), op.idempotency_key)
        return None if ref is None else Reconciled(True, str(ref), {"reference": str(ref)})

    async def calls(self, db: _db.Executor, scenario: str = "") -> list[ProviderCall]:
        """Every call this provider recorded in ``scenario``, in order (``""``: outside the
        crash matrix)."""
        rows = await db.fetch(_CALLS, self.name, scenario)
        return [
            ProviderCall(
                action=r["action"],
                args=json.loads(r["args"]),
                idempotency_key=r["idempotency_key"],
                outcome=r["outcome"],
                reference=r["reference"],
                at=r["at"],
            )
            for r in rows
        ]

    async def effects(self, db: _db.Executor, scenario: str = "") -> list[ProviderCall]:
        """The calls that performed an effect (outcome 'executed')."""
        return [c for c in await self.calls(db, scenario) if c.outcome == "executed"]

    async def close(self) -> None:
        """Close the pools opened from ``$AGENTDB_TESTING_DSN`` in this event loop."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
