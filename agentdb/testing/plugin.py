"""The pytest plugin (entry point ``pytest11``): the fixtures of :mod:`agentdb.testing._fixtures`.

pytest loads every installed ``pytest11`` entry point, so this module is
imported by anyone who has agentdb and pytest - with or without the
``[testing]`` extra. Without pytest-asyncio it registers nothing instead of
breaking the user's pytest run at start-up; ``pip install 'agentdb-pg[testing]'``
brings what the fixtures need.
"""

from __future__ import annotations

try:
    import pytest_asyncio  # noqa: F401  (what the fixtures need; see the docstring)
except ImportError:
    pass
else:
    from agentdb.testing._fixtures import (
        agentdb_bouncer,
        agentdb_bouncer_logins,
        agentdb_clones,
        agentdb_db,
        agentdb_login,
        agentdb_pool,
        agentdb_pooled_db,
        agentdb_pooled_pool,
        agentdb_server,
        agentdb_template,
        agentdb_tenant,
    )

    __all__ = [
        "agentdb_bouncer",
        "agentdb_bouncer_logins",
        "agentdb_clones",
        "agentdb_db",
        "agentdb_login",
        "agentdb_pool",
        "agentdb_pooled_db",
        "agentdb_pooled_pool",
        "agentdb_server",
        "agentdb_template",
        "agentdb_tenant",
    ]
