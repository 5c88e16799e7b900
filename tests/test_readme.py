"""The README is the front door: short, a handler early, install and test commands that
work, the generated guarantee table, links into the docs site. Its code blocks run with
every docs page's, by the rules of tests/test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= 250


def test_a_straight_line_handler_of_at_most_30_lines_comes_within_the_first_80() -> None:
    head = "\n".join(README.splitlines()[:80]) + "\n"
    [block] = re.findall(r"```python\n(.*?)```", head, flags=re.S)[:1]
    assert len(block.splitlines()) <= 30
    assert re.search(r"async def \w+\(job: Job\)", block)
    for call in ("job.step(", "job.effect(", "job.wait_for_signal("):
        assert call in block
    # An excerpt of the example that tests/test_docs.py runs as written.
    assert block in (ROOT / "examples" / "first_agent.py").read_text()


def test_the_readme_says_how_to_install_and_test_as_ci_does() -> None:
    """.ci/run installs the project the way the README says and runs its test command."""
    shell = "\n".join(re.findall(r"```sh\n(.*?)```", README, flags=re.S))
    assert "make install" in shell
    assert "pip install -e ." in shell
    assert re.search(r"^make test\b", shell, flags=re.M)
    assert re.search(r"^AGENTDB_TEST_DSN=\S+ make test\b", shell, flags=re.M)
    assert "make demo" in shell
    assert "not on PyPI yet" in README


def test_the_readme_shows_the_demo_report() -> None:
    report = re.search(r"```\n(agentdb demo report\n.*?)```", README, flags=re.S)
    assert report is not None
    assert "duplicate effects                                       0" in report.group(1)
    assert report.group(1).rstrip().splitlines()[-1].startswith("OK: every effect once")


def test_the_readme_keeps_the_generated_guarantee_table() -> None:
    from dev import docs

    assert docs.BEGIN in README
    assert docs.END in README
    assert docs.render_readme(README) == README, "README.md is stale: run `make readme`"


def test_the_readme_links_into_every_section_of_the_site() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")}
    assert pages <= linked, pages - linked
