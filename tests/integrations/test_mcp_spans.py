"""The tool span's OpenTelemetry GenAI attributes under a configured SDK (G16).

``mcp_spans.py`` runs in a process of its own (a tracer provider is set once per
process; the rest of the suite runs with none) and prints the spans an in-memory
exporter received: for the SDK's ``MCPServer`` and for FastMCP, a call with a
``traceparent`` and the same key again with other arguments (refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Database
from tests.integrations.mcp_spans import PARENT, TRACE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def traced(db: Database) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.integrations.mcp_spans", db.dsn],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return found


def _ancestors(spans: list[dict[str, Any]], span: dict[str, Any]) -> list[str]:
    by_id = {s["span_id"]: s for s in spans}
    chain, parent = [], span["parent"]
    while parent is not None:
        chain.append(parent)
        parent = by_id[parent]["parent"] if parent in by_id else None
    return chain


@pytest.mark.parametrize("tool", ["pay_sdk", "pay_fast"])
def test_G16_the_tool_span_carries_the_genai_attributes_and_its_ids_are_the_rows(
    traced: dict[str, Any], tool: str
) -> None:
    spans = traced["spans"]
    ok, refused = [s for s in spans if s["name"] == f"execute_tool {tool}"]
    for span in (ok, refused):
        attributes = span["attributes"]
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == tool
        assert attributes["gen_ai.tool.call.id"] == "k-1"
    assert ok["status"] == "UNSET"
    assert "error.type" not in ok["attributes"]
    assert refused["status"] == "ERROR"
    assert refused["attributes"]["error.type"] == "IdempotencyConflict"
    # The operation's row names the tool span (and its reserve is a child of it).
    [op] = [o for o in traced["operations"] if o["action"] == tool]
    assert (op["trace_id"], op["span_id"]) == (ok["trace_id"], ok["span_id"])
    [reserve] = [
        s
        for s in spans
        if s["name"] == "agentdb.operation.reserve" and s["parent"] == ok["span_id"]
    ]
    assert reserve["trace_id"] == ok["trace_id"]
    if tool == "pay_sdk":  # the caller's traceparent is an ancestor of the tool span
        assert ok["trace_id"] == TRACE
        assert PARENT in _ancestors(spans, ok)
    else:  # FastMCP's in-process client sends its own span as the traceparent
        [sent] = [s for s in spans if s["name"] == f"MCP send tools/call {tool}"
                  and s["trace_id"] == ok["trace_id"]]  # fmt: skip
        assert sent["span_id"] in _ancestors(spans, ok)
