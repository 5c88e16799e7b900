"""G16: trace/span ids come from the current OpenTelemetry span; absent (and valid) without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentdb import leases, operations, outbox, tasks, telemetry
from agentdb.errors import InvariantViolation
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent
_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> InMemorySpanExporter:
    # The global provider can be set only once per process.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    return _EXPORTER


def _hex(span: trace.Span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


async def test_G16_rows_take_the_ids_of_the_current_span(
    spans: InMemorySpanExporter,
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("agent-run") as run:
        want = _hex(run)
        task = await tasks.create(pool, tenants.a, "t")
        [claimed] = await leases.claim(pool, "w1")
        res = await operations.reserve(
            pool, tenants.a, task.id, "k", "send", {}, lease=claimed.lease
        )
        await operations.complete(pool, res.operation, result={}, lease=claimed.lease)
        async with pool.acquire() as conn:
            mid = await outbox.enqueue(conn, tenants.a, "t", {})
    assert (task.trace_id, task.span_id) == want
    assert (res.operation.trace_id, res.operation.span_id) == want
    row = await admin_conn.fetchrow("SELECT trace_id, span_id FROM agent_outbox WHERE id = $1", mid)
    assert row is not None
    assert (row["trace_id"], row["span_id"]) == want
    ev = await admin_conn.fetchrow(
        "SELECT trace_id, span_id FROM agent_events WHERE task_id = $1 AND task_state_version = 0",
        task.id,
    )
    assert ev is not None
    assert (ev["trace_id"], ev["span_id"]) == want
    names = {s.name for s in spans.get_finished_spans()}
    assert {
        "agentdb.task.claim",
        "agentdb.operation.reserve",
        "agentdb.operation.complete",
    } <= names
    reserve = next(s for s in spans.get_finished_spans() if s.name == "agentdb.operation.reserve")
    assert reserve.attributes is not None
    assert reserve.attributes["agentdb.operation.key"] == "k"
    assert reserve.attributes["agentdb.task_id"] == str(task.id)


async def test_G16_explicit_ids_win(
    spans: InMemorySpanExporter, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    with trace.get_tracer("test").start_as_current_span("run"):
        task = await tasks.create(pool, tenants.a, "t", trace_id="a" * 32, span_id="b" * 16)
    assert (task.trace_id, task.span_id) == ("a" * 32, "b" * 16)


async def test_G16_no_active_span_leaves_the_ids_empty(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    assert (task.trace_id, task.span_id) == (None, None)


def test_G16_without_opentelemetry_installed_rows_are_valid_and_untraced(
    db: Database, tenants: Tenants
) -> None:
    script = (
        "import sys, asyncio, uuid\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "import asyncpg\n"
        "from agentdb import tasks, telemetry\n"
        "assert telemetry.current_ids() == (None, None)\n"
        "async def main():\n"
        "    c = await asyncpg.connect(sys.argv[1])\n"
        "    t = await tasks.create(c, uuid.UUID(sys.argv[2]), 't')\n"
        "    print(t.trace_id, t.span_id)\n"
        "    await c.close()\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, db.url("agentdb_test_runtime"), str(tenants.a)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None"]


async def test_G16_semconv_pin_is_recorded_once_per_change(admin_conn: asyncpg.Connection) -> None:
    assert await telemetry.pinned_semconv(admin_conn) is None
    assert await telemetry.pin_semconv(admin_conn, "1.37.0")
    assert not await telemetry.pin_semconv(admin_conn, "1.37.0")  # unchanged: nothing written
    assert await telemetry.pin_semconv(admin_conn, "1.38.0")
    assert await telemetry.pinned_semconv(admin_conn) == "1.38.0"
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_semconv_pins") == 2
    with pytest.raises(InvariantViolation) as bad:
        await telemetry.pin_semconv(admin_conn, "latest")
    assert bad.value.constraint == "agent_semconv_pins_version_format"
