"""The README's example is examples/quickstart.py, and it runs as written (embedded default)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_is_the_quickstart_file() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert (ROOT / "examples" / "quickstart.py").read_text() in blocks


def test_quickstart_runs_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "task succeeded at state_version 2" in out.stdout
    assert "retry fresh=False" in out.stdout
