"""The adapters' extras: pinned, installed from a clean virtualenv, and what the suite tests."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: extra -> the distribution it pins, and a module of ours that needs it.
EXTRAS = {
    "pydantic-ai": ("pydantic-ai-slim", "agentdb.integrations.pydantic_ai"),
    "openai-agents": ("openai-agents", "agentdb.integrations.openai_agents"),
    "mcp": ("mcp", "agentdb.integrations.mcp"),
    "fastmcp": ("fastmcp", "agentdb.integrations.fastmcp"),
}


def _pins() -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins = {}
    for extra, (dist, _) in EXTRAS.items():
        [spec] = extras[extra]
        found = re.fullmatch(rf"{re.escape(dist)}(\[[\w,-]+\])?==([\w.]+)", spec)
        assert found, f"extra {extra!r} pins no exact release: {spec!r}"
        pins[dist] = found.group(2)
    return pins


def test_the_suite_runs_each_adapter_against_the_release_its_extra_pins() -> None:
    for dist, version in _pins().items():
        assert importlib.metadata.version(dist) == version, dist


def test_the_extras_install_into_a_clean_virtualenv_and_import(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "install", f"{ROOT}[{','.join(EXTRAS)}]"],
        check=True, timeout=900, capture_output=True,
    )  # fmt: skip
    probe = "; ".join(
        [f"import {module}" for _, module in EXTRAS.values()]
        + ["import importlib.metadata as m"]
        + [f"print({dist!r}, m.version({dist!r}))" for dist, _ in EXTRAS.values()]
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        check=True, timeout=120, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    installed = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert installed == _pins()
