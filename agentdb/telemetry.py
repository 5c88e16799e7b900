"""Trace linkage (G16): rows carry the trace and span of the run that wrote them.

With ``opentelemetry-api`` installed (``pip install 'agentdb[otel]'``) the
helpers that create tasks, transition them, reserve operations and enqueue
outbox messages take the trace and span ids of the current span unless the
caller passes its own. Without it the columns stay NULL (valid: the format
CHECKs accept NULL). Only the two ids are stored - detailed model and tool
telemetry belongs in the observability system, and nothing from a model or
provider transcript is copied into Postgres.

agentdb's own spans (``agentdb.task.claim``, ``agentdb.operation.reserve``,
``agentdb.operation.complete``, ``agentdb.relay.publish``) use stable
attribute names: ``agentdb.tenant_id``, ``agentdb.task_id``,
``agentdb.operation.key``, ``agentdb.operation.action``,
``agentdb.lease.token``, ``agentdb.batch.size``, ``agentdb.message_id``.

:func:`pin_semconv` records which version of the OpenTelemetry GenAI
semantic conventions the application's spans follow, so a later reader of a
trace id knows what the attribute names meant then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from agentdb import _db

__all__ = ["current_ids", "ids", "pin_semconv", "pinned_semconv", "span"]

try:  # an optional dependency
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised by a test that hides the package
    _trace = None  # type: ignore[assignment]

_TRACER_NAME = "agentdb"
_Q = _db.queries(__name__)


def current_ids() -> tuple[str | None, str | None]:
    """The current span's (trace_id, span_id) as lowercase hex, or (None, None)."""
    if _trace is None:
        return None, None
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def ids(trace_id: str | None, span_id: str | None) -> tuple[str | None, str | None]:
    """Explicit ids win; otherwise the current span's."""
    if trace_id is not None or span_id is not None:
        return trace_id, span_id
    return current_ids()


def _recording() -> bool:
    # With only opentelemetry-api installed (no SDK configured) the global
    # provider is a proxy handing out no-op spans; skip the ~14 us they cost.
    return _trace is not None and not isinstance(
        _trace.get_tracer_provider(), _trace.ProxyTracerProvider
    )


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    """An agentdb span around a step, when an OpenTelemetry SDK is configured; else nothing."""
    if _trace is None or not _recording():
        yield
        return
    tracer = _trace.get_tracer(_TRACER_NAME)
    clean = {
        k: (str(v) if not isinstance(v, int | float | bool | str) else v)
        for k, v in attributes.items()
        if v is not None
    }
    with tracer.start_as_current_span(name, attributes=clean):
        yield


async def pin_semconv(db: _db.Executor, version: str) -> bool:
    """Record ``version`` as the GenAI semantic conventions in use from now on.

    Returns false (and writes nothing) if it is already the latest pin.

    Raises:
        InvariantViolation: ``version`` is not a version number
            (``agent_semconv_pins_version_format``).
    """
    rows = await _db.fetch_many(db, _Q["semconv_pin"], version=version)
    return bool(rows)


async def pinned_semconv(db: _db.Executor) -> str | None:
    """The GenAI semantic-conventions version pinned last, if any."""
    rows = await _db.fetch_many(db, _Q["semconv_latest"])
    return str(rows[0]["version"]) if rows else None
