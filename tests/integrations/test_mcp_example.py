"""The MCP guide's examples are examples/mcp_payments.py (the SDK's server) and
examples/mcp_fastmcp.py (FastMCP) as they are, and each runs as written: its tool's
receipt is random, so a retry answered with the same receipt was answered from
Postgres, not performed again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("mcp_payments.py", "mcp_fastmcp.py")


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_mcp_guide_shows_the_mcp_example_as_the_file_is(name: str) -> None:
    example = (ROOT / "examples" / name).read_text()
    section = (ROOT / "docs" / "guides" / "mcp.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert example in blocks
    assert len(example.splitlines()) <= 40


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_mcp_example_runs_as_written_and_answers_the_retry_from_postgres(name: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True, text=True, timeout=240, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "5 paid to bob: receipt " in out.stdout, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("| the retry, from Postgres: True"), out.stdout
