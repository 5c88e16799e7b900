"""A pytest plugin for ``--collect-only`` runs: how many collected tests use the testing kit's
``agentdb_db`` fixture (directly, or through the suite's db / pool / tenants wrappers)."""

from __future__ import annotations

import json

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    using = [i.nodeid for i in session.items if "agentdb_db" in getattr(i, "fixturenames", ())]
    print("AGENTDB_CENSUS " + json.dumps({"tests": len(session.items), "using": len(using)}))
