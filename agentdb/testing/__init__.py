"""agentdb's testing kit: real-Postgres fixtures, an in-process drain, ledger assertions,
and the crash matrix for your own handlers.

``pip install 'agentdb-pg[testing]'`` brings pytest, pytest-asyncio and the
embedded Postgres; the fixtures (``agentdb_db``, ``agentdb_pool``,
``agentdb_tenant``, ``agentdb_pooled_pool``, ...) come from
:mod:`agentdb.testing.plugin`, which pytest loads by itself. This package is
a layer above the library: the library never imports it.
"""

from __future__ import annotations

from agentdb.testing._postgres import Database, Server
from agentdb.testing.crash import (
    WORKER_POINTS,
    CrashReport,
    CrashTestError,
    NotIdempotent,
    Scenario,
    crash_test,
)
from agentdb.testing.drain import Drained, DrainTimeout, drain
from agentdb.testing.ledger import (
    LedgerAssertion,
    assert_events,
    assert_inbox,
    assert_operation,
    assert_outbox,
    assert_tasks,
)
from agentdb.testing.provider import (
    ProviderCall,
    ProviderLedger,
    RecordingProvider,
    at_provider_call,
    current_scenario,
    recording,
)

__all__ = [
    "WORKER_POINTS",
    "CrashReport",
    "CrashTestError",
    "Database",
    "DrainTimeout",
    "Drained",
    "LedgerAssertion",
    "NotIdempotent",
    "ProviderCall",
    "ProviderLedger",
    "RecordingProvider",
    "Scenario",
    "Server",
    "assert_events",
    "assert_inbox",
    "assert_operation",
    "assert_outbox",
    "assert_tasks",
    "at_provider_call",
    "crash_test",
    "current_scenario",
    "drain",
    "recording",
]
