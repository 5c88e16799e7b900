"""The operator's console in a real headless Chromium (Selenium), against a real worker.

An approver signs in, sees the approval a running task asked for, approves
it and watches the task finish on its timeline; a principal of another
tenant sees none of it and a forged request for it is refused; a principal
who held the task's lease cannot approve it (the database refuses, G22); a
POST without its CSRF token is refused; an unknown effect is reconciled, a
failed task retried, and a dead message retried and seen delivered. The
console runs as its own process (``agentdb console``) connected as an
``agentdb_operator`` login, never the owner. Screenshots of the inbox and a
timeline go to docs/img/.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentdb import _db, leases, operations, outbox, tasks
from agentdb.relay import Relay
from agentdb.worker import Fail, Job, Succeed, Worker
from tests import _browser
from tests.conftest import OPERATOR, Database, Tenants

pytestmark = pytest.mark.plain_postgres("a browser session against one plain server is enough")

DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
WORKER = "worker-7"


def _token(name: str) -> str:
    return f"{name}-token-0123456789abcdef"


def _principals(t: Tenants) -> list[dict[str, Any]]:
    return [
        {"name": "alice@acme", "token": _token("alice@acme"), "tenants": [str(t.a)]},
        {"name": "bob@globex", "token": _token("bob@globex"), "tenants": [str(t.b)]},
        # The worker's own name: it held the task's lease, so it may not approve (G22).
        {"name": WORKER, "token": _token(WORKER), "tenants": [str(t.a)]},
    ]


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    d = _browser.browser()
    try:
        yield d
    finally:
        d.quit()


def _until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _login(d: Any, base: str, name: str) -> None:
    from selenium.webdriver.common.by import By

    d.get(f"{base}/login")
    d.delete_all_cookies()
    d.get(f"{base}/login")
    d.find_element(By.ID, "token").send_keys(_token(name))
    d.find_element(By.CSS_SELECTOR, "#login button").click()
    _until(f"{name} signed in", lambda: _text(d, "who") == name)


def _text(d: Any, element_id: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        text: str = d.find_element(By.ID, element_id).text
    except (NoSuchElementException, StaleElementReferenceException):
        return None
    return text


def _row_with(d: Any, table_id: str, needle: str) -> Any:
    from selenium.webdriver.common.by import By

    for row in d.find_elements(By.CSS_SELECTOR, f"#{table_id} tr"):
        if needle in row.text:
            return row
    return None


def _post_from_page(d: Any, url: str, fields: dict[str, str]) -> None:
    """Submit a form the page did not offer (a forged request), with the page's CSRF token."""
    d.execute_script(
        """
        const f = document.createElement('form');
        f.method = 'post'; f.action = arguments[0];
        const csrf = document.querySelector('input[name=csrf]').value;
        const fields = Object.assign({csrf: csrf}, arguments[1]);
        for (const [k, v] of Object.entries(fields)) {
            const i = document.createElement('input');
            i.name = k; i.value = v; f.appendChild(i);
        }
        document.body.appendChild(f); f.submit();
        """,
        url,
        fields,
    )


def _stranger(
    d: Any, base: str, tenants: Tenants, task_id: uuid.UUID
) -> tuple[bool, str, str, str]:
    """Bob (tenant b) looks for tenant a's task and forges approvals of it, two ways."""
    page = f"/t/{tenants.a}/task/{task_id}"
    _login(d, base, "bob@globex")
    d.get(f"{base}/inbox")
    seen = str(task_id) in d.page_source
    d.get(f"{base}{page}")
    direct = d.page_source
    _post_from_page(d, f"{page}/decide/approve", {"signal": "approval"})
    _until("the answer", lambda: "Not here" in d.page_source)
    forged = d.page_source
    d.get(f"{base}/")
    # Under its own tenant's URL the task is not there either (RLS).
    _post_from_page(d, f"/t/{tenants.b}/task/{task_id}/decide/approve", {"signal": "approval"})
    _until("the answer", lambda: "Not here" in d.page_source)
    return seen, direct, forged, d.page_source


def _csrf_less(d: Any, base: str, path: str) -> int:
    """Alice's signed-in session posts an approval without its CSRF token: the status."""
    _login(d, base, "alice@acme")
    cookie = d.get_cookie("agentdb_console")["value"]
    request = urllib.request.Request(
        f"{base}{path}",
        data=b"signal=approval&comment=forged",
        headers={"Cookie": f"agentdb_console={cookie}"},
    )
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


async def _reaches(pool: _db.Pool, tenant: uuid.UUID, task_id: uuid.UUID, *states: str) -> None:
    for _ in range(600):
        if (await tasks.get(pool, tenant, task_id)).state in states:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {states}")


async def _lookup(order: str) -> dict[str, Any]:
    return {"order": order, "amount": 4200}


async def _refund(amount: int, *, idempotency_key: str) -> dict[str, str]:
    return {"refund": f"re_{idempotency_key[-8:]}", "amount": str(amount)}


async def refund_agent(job: Job) -> Succeed | Fail:
    order = await job.step("lookup", _lookup, job.task.params["order"])
    review = await job.wait_for_signal("review", "approval")
    if review is None or review.decision != "approved":
        return Fail("not approved")
    paid = await job.effect("refund", _refund, order["amount"])
    return Succeed(payload={"refund": paid["refund"], "approved_by": review.sender})


async def test_console_approve_a_waiting_task_and_watch_it_finish(
    db: Database,
    tenants: Tenants,
    agentdb_pool: _db.Pool,
    admin_conn: asyncpg.Connection,
    driver: Any,
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    pool = agentdb_pool
    worker = Worker(pool, {"refund": refund_agent}, worker_id=WORKER, poll_interval=0.1)
    running = asyncio.create_task(worker.run(install_signals=False))
    try:
        task = await tasks.create(pool, tenants.a, "refund", params={"order": "A-17"})
        await _reaches(pool, tenants.a, task.id, "waiting")
        page = f"/t/{tenants.a}/task/{task.id}"
        with _browser.console(db.url(OPERATOR), _principals(tenants), tmp_path) as (base, _):
            d = driver

            # The lease holder sees the approval but may not give it: the database refuses.
            def holder() -> str | None:
                _login(d, base, WORKER)
                d.get(f"{base}/inbox")
                row = _row_with(d, "approvals", str(task.id))
                assert row is not None, d.page_source
                row.find_element(By.XPATH, ".//button[text()='Approve']").click()
                _until("the refusal", lambda: _text(d, "error") is not None)
                return _text(d, "error")

            refusal = await asyncio.to_thread(holder)
            assert refusal is not None
            assert "refused" in refusal, refusal
            assert "cannot approve its own work" in refusal, refusal

            # Another tenant's principal sees none of it, and a forged request is refused.
            seen, direct, forged, forged_own = await asyncio.to_thread(
                _stranger, d, base, tenants, task.id
            )
            assert not seen
            assert "no such tenant" in direct
            assert "no such tenant" in forged
            assert "not found" in forged_own

            # A POST without its CSRF token, with a signed-in session, is refused.
            assert await asyncio.to_thread(_csrf_less, d, base, f"{page}/decide/approve") == 403
            refused = await admin_conn.fetchval(
                "SELECT count(*) FROM agent_signals WHERE task_id = $1", task.id
            )
            assert refused == 0  # nothing of the above reached the task

            # The approver: the inbox shows what the task wants, approve it, watch it finish.
            def approver() -> str | None:
                d.get(f"{base}/inbox")
                row = _row_with(d, "approvals", str(task.id))
                assert row is not None, d.page_source
                assert "A-17" in row.text, row.text
                assert "lookup" in row.text, row.text
                DOCS.mkdir(parents=True, exist_ok=True)
                d.save_screenshot(str(DOCS / "console-inbox.png"))
                row.find_element(By.CSS_SELECTOR, "input.comment").send_keys("within policy")
                row.find_element(By.XPATH, ".//button[text()='Approve']").click()
                _until("the approval", lambda: "approved" in (_text(d, "flash") or ""))
                d.get(f"{base}{page}")
                # No reload by hand: the page's live updates bring the finish.
                _until("the finish", lambda: _text(d, "task-state") == "succeeded", 60)
                d.save_screenshot(str(DOCS / "console-timeline.png"))
                return _text(d, "events")

            events = await asyncio.to_thread(approver)
            assert events is not None
            assert "task.approved" in events
            assert "task.succeeded" in events
        await _reaches(pool, tenants.a, task.id, "succeeded")
        actor = await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE task_id = $1 AND event_type = 'task.approved'",
            task.id,
        )
        assert actor == "alice@acme"
        signal = await admin_conn.fetchrow(
            "SELECT sender, payload->>'comment' AS comment FROM agent_signals WHERE task_id = $1",
            task.id,
        )
        assert signal is not None
        assert (signal["sender"], signal["comment"]) == ("alice@acme", "within policy")
    finally:
        worker.stop()
        await running


async def _unknown_effect_and_dead_message(
    pool: _db.Pool, tenant: uuid.UUID
) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A failed task that left an effect unknown and a message dead."""
    task = await tasks.create(pool, tenant, "charge", params={"amount": 700})
    [claimed] = await leases.claim(pool, "worker-x", task_types=["charge"])
    lease = claimed.lease
    assert lease is not None
    reserved = await operations.reserve(
        pool, tenant, task.id, f"{task.id}/charge", "psp.charge", {"amount": 700}, lease=lease
    )
    await operations.mark_unknown(pool, reserved.operation, error="timeout", lease=lease)
    async with _db.transaction(pool) as conn:
        message = await outbox.enqueue(
            conn, tenant, "invoice.paid", {"amount": 700}, task_id=task.id, max_attempts=1
        )
    [claimed_msg] = await outbox.claim(pool, "relay-x")
    await outbox.mark_failed(pool, claimed_msg, "consumer down", backoff=timedelta(0))
    now = await tasks.get(pool, tenant, task.id)
    await tasks.transition(
        pool, tenant, task.id, expected_version=now.state_version, to_state="failed",
        error="psp timed out", lease=lease,
    )  # fmt: skip
    return task.id, reserved.operation.id, message


async def test_console_reconciles_an_unknown_effect_and_retries_a_task_and_a_dead_message(
    db: Database,
    tenants: Tenants,
    agentdb_pool: _db.Pool,
    admin_conn: asyncpg.Connection,
    driver: Any,
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    pool = agentdb_pool
    task_id, op_id, message_id = await _unknown_effect_and_dead_message(pool, tenants.a)
    assert (await outbox.get(pool, tenants.a, message_id)).state == "dead"
    page = f"/t/{tenants.a}/task/{task_id}"
    with _browser.console(db.url(OPERATOR), _principals(tenants), tmp_path) as (base, _):
        d = driver

        def reconcile() -> None:
            _login(d, base, "alice@acme")
            d.get(f"{base}/effects")
            row = _row_with(d, "unsettled", str(op_id))
            assert row is not None, d.page_source
            row.find_element(By.CSS_SELECTOR, "input.reference").send_keys("ch_123")
            row.find_element(By.XPATH, ".//button[text()='Reconcile']").click()
            _until("the reconcile", lambda: "reconciled" in (_text(d, "flash") or ""))
            assert _row_with(d, "unsettled", str(op_id)) is None

        await asyncio.to_thread(reconcile)
        op = await operations.get(pool, tenants.a, op_id)
        assert (op.state, op.provider_reference) == ("succeeded", "ch_123")
        actor = await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE operation_id = $1"
            " AND event_type = 'operation.reconciled'",
            op_id,
        )
        assert actor == "alice@acme"

        def retry_task() -> str | None:
            d.get(f"{base}{page}")
            d.find_element(By.CSS_SELECTOR, "#retry button").click()
            _until("the retry", lambda: "back to pending" in (_text(d, "flash") or ""))
            return _text(d, "task-state")

        assert await asyncio.to_thread(retry_task) == "pending"
        actor = await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE task_id = $1 AND event_type = 'task.retried'",
            task_id,
        )
        assert actor == "alice@acme"

        def retry_message() -> None:
            d.get(f"{base}/outbox")
            row = _row_with(d, "dead", str(message_id))
            assert row is not None, d.page_source
            row.find_element(By.XPATH, ".//button[text()='Retry']").click()
            _until("the retry", lambda: "retried" in (_text(d, "flash") or ""))

        await asyncio.to_thread(retry_message)
        delivered: list[uuid.UUID] = []

        async def publish(message: Any) -> None:
            delivered.append(message.id)

        relay = Relay(pool, publish, relay_id="relay-y", poll_interval=0.1)
        relaying = asyncio.create_task(relay.run(install_signals=False))
        try:
            for _ in range(300):
                if (await outbox.get(pool, tenants.a, message_id)).state == "delivered":
                    break
                await asyncio.sleep(0.05)
        finally:
            relay.stop()
            await relaying
        assert delivered == [message_id]

        def seen_delivered() -> None:
            d.get(f"{base}{page}")
            row = _row_with(d, "messages", str(message_id))
            assert row is not None, d.page_source
            assert "delivered" in row.text, d.page_source

        await asyncio.to_thread(seen_delivered)
        actor = await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE task_id = $1"
            " AND event_type = 'outbox.retried'",
            task_id,
        )
        assert actor == "alice@acme"
