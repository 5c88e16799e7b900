"""The agent-framework adapters' tests: each runs against the framework release its extra pins.

``make install`` (the ``dev`` extra) installs both frameworks, so ``make test``
runs these; a checkout installed without them (``pip install agentdb-pg[test]``)
does not collect the files of a framework it lacks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib.util import find_spec

import asyncpg
import pytest

from agentdb import create_pool
from agentdb.testing import recording
from agentdb.testing.provider import install
from tests.conftest import Database

collect_ignore_glob = [
    pattern
    for module, pattern in (
        ("pydantic_ai", "test_pydantic_ai*.py"),
        ("agents", "test_openai_agents*.py"),
        ("mcp", "test_mcp*.py"),
        ("fastmcp", "test_fastmcp*.py"),
        ("fastmcp", "test_mcp_spans.py"),
    )
    if find_spec(module) is None
]


@pytest.fixture
async def recorded(db: Database) -> AsyncIterator[asyncpg.Pool]:
    """The test database as its owner, where the fake provider records what it did."""
    async with await create_pool(db.dsn) as pool:
        await install(pool)
        with recording(pool):
            yield pool
