"""The front door: what agentdb.__all__ promises imports, docs/api.md lists exactly it, and
the type checkers' view of the package (its TYPE_CHECKING block) names the same things.

And the errors the front door documents: a bad argument a docstring promises a
ConfigurationError for raises that, before anything is written - not a raw
InvariantViolation from a CHECK further in, and not a silent success (issue 35's blind
class: documented errors at the library's boundary)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import agentdb
from agentdb import children, leases, outbox, steps, tasks
from agentdb.errors import ConfigurationError
from agentdb.worker import Job
from tests.conftest import Tenants

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"


@pytest.mark.parametrize("name", agentdb.__all__)
def test_every_public_name_imports_from_the_package(name: str) -> None:
    assert getattr(agentdb, name) is not None
    assert name in dir(agentdb)


def test_star_import_gives_every_public_name_in_a_fresh_interpreter() -> None:
    probe = "from agentdb import *; import agentdb; print(set(agentdb.__all__) <= globals().keys())"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "True"


def test_a_handler_author_needs_nothing_but_the_package() -> None:
    from agentdb import worker
    from agentdb.errors import LeaseLost, StepConflict

    for name in ("Worker", "Job", "Succeed", "Fail", "Retry", "Wait", "create_pool"):
        assert name in agentdb.__all__, name
    assert agentdb.Worker is worker.Worker
    assert agentdb.LeaseLost is LeaseLost
    assert agentdb.StepConflict is StepConflict


def _documented() -> list[str]:
    return re.findall(r"^- `(\w+)` - ", PAGE.read_text(encoding="utf-8"), flags=re.M)


def test_the_api_page_lists_exactly_the_public_names_once() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), "a name listed twice"
    assert sorted(documented) == agentdb.__all__


def test_the_type_checkers_see_exactly_the_public_names_from_their_homes() -> None:
    """The TYPE_CHECKING imports are the one place the names are written a second time
    (type checkers cannot follow __getattr__): they must re-export what _PUBLIC says."""
    tree = ast.parse((ROOT / "agentdb" / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    )
    seen: dict[str, str] = {}
    for node in block.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "typing":
            continue
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            home = "" if node.module == "agentdb" else str(node.module)
            seen[alias.name] = home
    public = {name: home for home, names in agentdb._PUBLIC.items() for name in names}
    assert seen == public


def test_import_agentdb_loads_nothing_else() -> None:
    """The lazy loading stays: `import agentdb` (the CLI's first step) imports no module of
    its own, not asyncpg, not typing (``__future__``, for its annotations, is all)."""
    probe = (
        "import sys; before = set(sys.modules); import agentdb; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "['__future__', 'agentdb']"


# ---- documented errors at the boundary ---------------------------------------------------


async def test_deliver_and_claim_refuses_a_lease_that_has_already_run_out(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """As outbox.claim does: a visibility of 0 or less leased the message already over, and a
    second relay took it at once - two publishes. Kills boundary-deliver-and-claim-any-
    visibility (deliver_and_claim had no such check: a real bug, fixed)."""
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t", {"n": 1})
    for visibility in (timedelta(seconds=-30), timedelta(0)):
        with pytest.raises(ConfigurationError, match="visibility"):
            await outbox.deliver_and_claim(pool, "r1", [], visibility=visibility)
    marked, claimed = await outbox.deliver_and_claim(pool, "r1", [])  # control
    assert (marked, len(claimed)) == (set(), 1)
    assert await outbox.deliver_and_claim(pool, "r2", []) == (set(), [])


@pytest.mark.parametrize(
    "ttl",
    [
        timedelta(0),
        timedelta(seconds=-1),
        timedelta(milliseconds=999),
        timedelta(days=1, seconds=1),
    ],
    ids=["zero", "negative", "under-a-second", "over-a-day"],
)
async def test_a_lease_ttl_out_of_bounds_is_a_configuration_error_for_claim_and_renew(
    ttl: timedelta, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The Worker refuses these lease_ttl values; leases.claim and leases.renew took them: 0
    raised a raw InvariantViolation (agent_tasks_lease_window) from claim and renewed a lease
    to one already over, and a day and a second held a crashed holder's task past the task's
    own bound. Nothing is claimed or renewed. Kills boundary-claim-lease-ttl-unchecked and
    boundary-renew-lease-ttl-unchecked."""
    task = await tasks.create(pool, tenants.a, "b-ttl")
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        await leases.claim(pool, "w", task_types=["b-ttl"], lease_ttl=ttl)
    untouched = await tasks.get(pool, tenants.a, task.id)
    assert (untouched.state, untouched.attempts) == ("pending", 0)
    [held] = await leases.claim(pool, "w", task_types=["b-ttl"], lease_ttl=timedelta(seconds=1))
    lease = held.lease
    assert lease is not None
    with pytest.raises(ConfigurationError, match="lease_ttl"):
        await leases.renew(pool, lease, lease_ttl=ttl)
    assert (await tasks.get(pool, tenants.a, task.id)).lease_expires_at == lease.expires_at
    renewed = await leases.renew(pool, lease, lease_ttl=timedelta(days=1))  # control
    assert renewed.expires_at > lease.expires_at


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda job: job.run_children("kids", [("b-kid", None)], quorum=0), "quorum"),
        (lambda job: job.run_children("kids", [("b-kid", None)], quorum=2), "quorum"),
        (lambda job: job.run_children("kids", []), "at least one child"),
        (lambda job: job.sleep("nap", timedelta(seconds=-1)), "sleep"),
        (lambda job: job.wait_for_signal("ok", "go", timeout=timedelta(seconds=-1)), "timeout"),
        (lambda job: job.step("", lambda: 1), "step name"),
    ],
    ids=["quorum-0", "quorum-over", "no-children", "negative-sleep", "negative-timeout",
         "empty-name"],
)  # fmt: skip
async def test_a_durable_steps_bad_arguments_are_configuration_errors_recording_nothing(
    call: Any, what: str, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Job's documented ConfigurationErrors: no step is recorded, no child spawned, the task
    not put to sleep. Kills boundary-children-quorum-unchecked,
    boundary-sleep-negative-unchecked and boundary-wait-timeout-negative-unchecked."""
    task = await tasks.create(pool, tenants.a, "b-job")
    [held] = await leases.claim(pool, "w", task_types=["b-job"])
    with pytest.raises(ConfigurationError, match=what):
        await call(Job(pool, held, reconcilers={}))
    ledger = await steps.ledger(pool, tenants.a, task.id)
    assert (ledger.steps, ledger.effects) == ({}, {})
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.state_version) == ("running", held.state_version)
    assert await children.count(pool, tenants.a, task.id) == 0
