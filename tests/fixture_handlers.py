"""Handlers and publishers the CLI tests load by MODULE:ATTRIBUTE."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agentdb.models import OutboxMessage
from agentdb.worker import Job


async def slow(job: Job) -> None:
    """Sleeps far longer than any test waits; records that it started."""
    await asyncio.to_thread(Path(os.environ["AGENTDB_TEST_MARKER"]).write_text, str(job.task.id))
    await asyncio.sleep(3600)


HANDLERS = {"slow": slow}
NOT_A_DICT = 42


async def broken_publisher(message: OutboxMessage) -> None:
    raise ConnectionError("broker refused the connection")
