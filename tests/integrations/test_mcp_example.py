"""The MCP guide's example is examples/mcp_payments.py as it is, and it runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mcp_payments.py"


def test_the_mcp_guide_shows_the_mcp_example_as_the_file_is() -> None:
    section = (ROOT / "docs" / "guides" / "mcp.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert EXAMPLE.read_text() in blocks
    assert len(EXAMPLE.read_text().splitlines()) <= 40


def test_the_mcp_example_runs_as_written_and_answers_the_retry_from_postgres() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True, text=True, timeout=240, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "paid 5 to bob, provider key" in out.stdout, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("| the retry, from Postgres: True"), out.stdout
