"""The agent-framework adapters' tests: each runs against the framework release its extra pins.

``make install`` (the ``dev`` extra) installs both frameworks, so ``make test``
runs these; a checkout installed without them (``pip install agentdb-pg[test]``)
does not collect the files of a framework it lacks.
"""

from __future__ import annotations

from importlib.util import find_spec

collect_ignore_glob = [
    pattern
    for module, pattern in (
        ("pydantic_ai", "test_pydantic_ai*.py"),
        ("agents", "test_openai_agents*.py"),
        ("mcp", "test_mcp*.py"),
    )
    if find_spec(module) is None
]
