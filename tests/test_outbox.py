"""Outbox (G10) in the caller's transaction, relay marks fenced by token; inbox (G11)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from decimal import Decimal

import asyncpg
import pytest

from agentdb import inbox, outbox, tasks
from agentdb.errors import ConfigurationError, LeaseLost, NotFound
from agentdb.models import OutboxMessage
from agentdb.relay import Relay
from tests.conftest import RUNTIME, Database, Tenants


async def test_G10_enqueue_commits_and_rolls_back_with_the_callers_transaction(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await outbox.enqueue(conn, tenants.a, "invoice.sent", {"n": 1})
        await tx.rollback()  # the business write failed
        async with conn.transaction():
            kept = await outbox.enqueue(conn, tenants.a, "invoice.sent", {"n": 2})
    claimed = await outbox.claim(pool, "relay-1")
    assert [m.id for m in claimed] == [kept]
    assert claimed[0].payload == {"n": 2}


async def test_G10_claim_mark_delivered_and_failure_backoff_then_dead(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async with pool.acquire() as conn:
        ok = await outbox.enqueue(conn, tenants.a, "t", {})
        bad = await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=2)
    msgs = {m.id: m for m in await outbox.claim(pool, "relay-1", batch=10)}
    assert await outbox.claim(pool, "relay-2", batch=10) == []  # invisible while leased
    assert await outbox.mark_delivered(pool, [msgs[ok]]) == {ok}
    first = await outbox.mark_failed(pool, msgs[bad], "503", backoff=timedelta(0))
    assert (first.state, first.attempts) == ("pending", 1)
    [retry] = await outbox.claim(pool, "relay-1")
    final = await outbox.mark_failed(pool, retry, "503 again", backoff=timedelta(0))
    assert (final.state, final.attempts) == ("dead", 2)
    states = {
        r["id"]: r["state"] for r in await admin_conn.fetch("SELECT id, state FROM agent_outbox")
    }
    assert states == {ok: "delivered", bad: "dead"}


async def test_G10_a_relay_that_lost_its_claim_marks_nothing(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async with pool.acquire() as conn:
        mid = await outbox.enqueue(conn, tenants.a, "t", {})
    [slow] = await outbox.claim(pool, "relay-1", visibility=timedelta(milliseconds=1))
    await admin_conn.execute("SELECT pg_sleep(0.01)")
    [fast] = await outbox.claim(pool, "relay-2")
    assert fast.lease_token == slow.lease_token + 1
    assert await outbox.mark_delivered(pool, [slow]) == set()
    with pytest.raises(LeaseLost):
        await outbox.mark_failed(pool, slow, "x", backoff=timedelta(0))
    assert await outbox.mark_delivered(pool, [fast]) == {mid}


async def test_G10_a_delivered_message_is_marked_delivered_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A relay that marks a message again under the same lease token (its first mark
    committed, the answer was lost) is told it no longer holds it, and the message keeps
    the instant it was delivered at. Kills generated
    ``gen-outbox-outbox_mark_delivered-list-1`` (only a dead message left alone: a
    delivered one marked again, its delivered_at moved to the second mark)."""
    async with pool.acquire() as conn:
        mid = await outbox.enqueue(conn, tenants.a, "t", {})
    [m] = await outbox.claim(pool, "relay-1")
    assert await outbox.mark_delivered(pool, [m]) == {mid}
    query = "SELECT state, delivered_at FROM agent_outbox WHERE id = $1"
    first = await admin_conn.fetchrow(query, mid)
    assert first is not None
    assert first["state"] == "delivered"
    assert await outbox.mark_delivered(pool, [m]) == set()
    assert await admin_conn.fetchrow(query, mid) == first


async def test_G11_inbox_processes_a_redelivered_message_once(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    message = uuid.uuid4()
    effects: list[int] = []

    async def handler(conn: object) -> int:
        effects.append(1)
        return len(effects)

    assert await inbox.process_once(pool, tenants.a, "billing", message, handler) == (True, 1)
    assert await inbox.process_once(pool, tenants.a, "billing", message, handler) == (False, None)
    assert await inbox.process_once(pool, tenants.a, "audit", message, handler) == (True, 2)
    assert effects == [1, 1]


async def test_G11_a_failed_handler_leaves_the_message_unprocessed(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    message = uuid.uuid4()

    async def broken(conn: object) -> None:
        raise ValueError("downstream down")

    async def fine(conn: object) -> str:
        return "done"

    with pytest.raises(ValueError, match="downstream down"):
        await inbox.process_once(pool, tenants.a, "c", message, broken)
    assert await inbox.process_once(pool, tenants.a, "c", message, fine) == (True, "done")


async def test_G10_delivery_state_is_queryable(pool: asyncpg.Pool, tenants: Tenants) -> None:
    async with pool.acquire() as conn:
        mid = await outbox.enqueue(conn, tenants.a, "t", {"k": 1})
    before = await outbox.get(pool, tenants.a, mid)
    assert (before.state, before.attempts, before.delivered_at) == ("pending", 0, None)
    [m] = await outbox.claim(pool, "relay-1")
    await outbox.mark_delivered(pool, [m])
    after = await outbox.get(pool, tenants.a, mid)
    assert (after.state, after.attempts) == ("delivered", 1)
    assert after.delivered_at is not None
    with pytest.raises(NotFound):
        await outbox.get(pool, tenants.b, mid)


async def test_G10_deliver_and_claim_marks_the_tenant_s_message_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A message id is unique per tenant only (enqueue takes the caller's): tenants a and
    b each have message X, claimed by one relay, both at lease token 1. Marking a's X
    delivered leaves b's X pending - it was not published. Kills generated
    ``gen-outbox-outbox_deliver_and_claim-tenant-1`` (the mark matching id and token
    alone: b's message marked delivered unsent, lost)."""
    twin = uuid.uuid4()
    async with pool.acquire() as conn:
        for tenant in (tenants.a, tenants.b):
            await outbox.enqueue(conn, tenant, "t", {"n": 1}, message_id=twin)
    held = await outbox.claim(pool, "relay-1", batch=2)
    assert sorted((m.id, m.lease_token) for m in held) == [(twin, 1), (twin, 1)]
    [a_message] = [m for m in held if m.tenant_id == tenants.a]
    marked, _ = await outbox.deliver_and_claim(pool, "relay-1", [a_message], batch=10)
    assert marked == {twin}
    rows = await admin_conn.fetch("SELECT tenant_id, state FROM agent_outbox WHERE id = $1", twin)
    assert {r["tenant_id"]: r["state"] for r in rows} == {
        tenants.a: "delivered",
        tenants.b: "pending",
    }


async def test_G10_deliver_and_claim_marks_the_held_and_claims_the_next(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """One statement marks what relay-1 still holds (fenced by token, as mark_delivered)
    and leases the next due messages; a message relay-1 lost to relay-2 stays relay-2's."""
    async with pool.acquire() as conn:
        for i in range(2):
            await outbox.enqueue(conn, tenants.a, "t", {"n": i})
    held = await outbox.claim(pool, "relay-1", batch=2, visibility=timedelta(milliseconds=1))
    await admin_conn.execute("SELECT pg_sleep(0.01)")
    # relay-2 takes one of them over (relay-1's visibility ran out).
    [taken] = await outbox.claim(pool, "relay-2", batch=1)
    [kept] = [m for m in held if m.id != taken.id]
    async with pool.acquire() as conn:
        later = {await outbox.enqueue(conn, tenants.a, "t", {"n": i}) for i in range(3)}
    marked, claimed = await outbox.deliver_and_claim(pool, "relay-1", held, batch=10)
    assert marked == {kept.id}
    assert {m.id for m in claimed} == later  # not the delivered one, not relay-2's
    assert all(m.lease_owner == "relay-1" for m in claimed)
    rows = {r["id"]: r for r in await admin_conn.fetch("SELECT * FROM agent_outbox")}
    assert rows[kept.id]["state"] == "delivered"
    assert rows[taken.id]["state"] == "pending"
    assert rows[taken.id]["lease_owner"] == "relay-2"
    # Nothing to mark: a plain claim (of nothing left here).
    assert await outbox.deliver_and_claim(pool, "relay-1", [], batch=10) == (set(), [])
    # Sent again (its answer was lost): what is delivered is not marked twice, and keeps
    # the time it was delivered (generated gen-outbox-outbox_deliver_and_claim-list-1).
    delivered_at = rows[kept.id]["delivered_at"]
    assert await outbox.deliver_and_claim(pool, "relay-1", [kept], batch=10) == (set(), [])
    again = await admin_conn.fetchval(
        "SELECT delivered_at FROM agent_outbox WHERE id = $1", kept.id
    )
    assert again == delivered_at
    with pytest.raises(ConfigurationError):
        await outbox.deliver_and_claim(pool, "relay-1", [], batch=0)


async def test_G10_deliver_and_claim_never_claims_a_message_it_marks(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A relay that stalled past its visibility marks its batch: those messages are due
    again by their next_attempt_at, yet the same statement does not lease them anew - they
    end delivered, not pending under a new token. Control: a message not being marked
    whose visibility ran out is claimed."""
    async with pool.acquire() as conn:
        for i in range(3):
            await outbox.enqueue(conn, tenants.a, "t", {"n": i})
    held = await outbox.claim(pool, "relay-1", batch=3, visibility=timedelta(milliseconds=1))
    await admin_conn.execute("SELECT pg_sleep(0.01)")
    marked, claimed = await outbox.deliver_and_claim(pool, "relay-1", held[:2], batch=10)
    assert marked == {held[0].id, held[1].id}
    assert [m.id for m in claimed] == [held[2].id]
    assert claimed[0].lease_token == held[2].lease_token + 1
    rows = {r["id"]: r for r in await admin_conn.fetch("SELECT * FROM agent_outbox")}
    for before in held[:2]:
        row = rows[before.id]
        assert (row["state"], row["lease_token"]) == ("delivered", before.lease_token)


async def test_G10_a_number_python_will_not_read_as_int_does_not_strand_the_batch(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A row written by SQL of one's own may hold an integer of any length; Python reads
    none over 4,300 digits as int. The claim used to commit its leases and then fail on
    that row: the whole batch stranded, attempts spent, the relay down on every try."""
    async with pool.acquire() as conn:
        good = await outbox.enqueue(conn, tenants.a, "t", {"n": 1})
    big = await admin_conn.fetchval(
        "INSERT INTO agent_outbox (tenant_id, topic, payload)"
        " VALUES ($1, 't', jsonb_build_object('n', repeat('9', 5000)::numeric)) RETURNING id",
        tenants.a,
    )
    claimed = {m.id: m for m in await outbox.claim(pool, "r1", batch=10)}
    assert set(claimed) == {good, big}
    assert claimed[good].payload == {"n": 1}
    assert claimed[big].payload["n"] == Decimal("9" * 5000)  # exact
    assert await outbox.mark_delivered(pool, list(claimed.values())) == {good, big}


async def _run_out(pool: asyncpg.Pool, admin_conn: asyncpg.Connection, times: int) -> None:
    """``times`` claims of every due message whose outcome is never recorded: each
    relay stops mid-publish, its visibility runs out."""
    for _ in range(times):
        assert await outbox.claim(pool, "dies", batch=10, visibility=timedelta(milliseconds=1))
        await admin_conn.execute("SELECT pg_sleep(0.01)")


async def test_G10_a_message_whose_relay_stops_on_every_attempt_is_buried_at_its_last(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A poison message kills its relay mid-publish every time: no failure is recorded,
    so outbox_mark_failed never buries it. The claim does, once it used its attempts,
    instead of handing it out for ever. Control: beside it, a message with an attempt
    left is claimed."""
    async with pool.acquire() as conn:
        poison = await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=2)
    await _run_out(pool, admin_conn, 2)
    async with pool.acquire() as conn:
        fresh = await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=2)
    assert [m.id for m in await outbox.claim(pool, "next", batch=10)] == [fresh]
    dead = await outbox.get(pool, tenants.a, poison)
    assert (dead.state, dead.attempts) == ("dead", 2)
    assert dead.last_error == (
        "no outcome recorded for attempt 2 of 2: its relay stopped or lost the claim mid-publish"
    )
    assert (await outbox.get(pool, tenants.a, fresh)).state == "pending"


async def test_G10_deliver_and_claim_buries_a_message_that_used_its_attempts(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async with pool.acquire() as conn:
        poison = await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=1)
        fresh = await outbox.enqueue(conn, tenants.a, "t", {})
    await _run_out(pool, admin_conn, 1)  # both claimed once; fresh has attempts left
    marked, claimed = await outbox.deliver_and_claim(pool, "next", [], batch=10)
    assert (marked, [m.id for m in claimed]) == (set(), [fresh])
    assert (await outbox.get(pool, tenants.a, poison)).state == "dead"


async def test_G10_a_relay_drains_past_a_batch_that_was_all_buried(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The relay's claim buries a whole batch and claims nothing: the drain goes on to
    the messages behind it, and counts the buried ones dead."""
    async with pool.acquire() as conn:
        poison = [await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=1) for _ in range(2)]
    await _run_out(pool, admin_conn, 1)
    async with pool.acquire() as conn:
        later = {await outbox.enqueue(conn, tenants.a, "t", {}) for _ in range(3)}
    published: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        published.append(message.id)

    relay = Relay(pool, publish, batch=2)
    assert await relay.drain() == 3
    assert set(published) == later
    assert relay.stats.dead == 2
    for mid in poison:
        assert (await outbox.get(pool, tenants.a, mid)).state == "dead"


async def test_G10_G2_a_retry_reads_its_own_tenant_s_message_of_a_shared_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Message ids are the caller's to choose (enqueue's message_id), so two tenants can
    each have a dead message of one id: an operator's retry in one tenant reads and puts
    back that tenant's only, and its event says the attempts that one used. Kills
    generated ``gen-outbox-outbox_retry-tenant-1`` (the attempts read by id alone)."""
    shared = uuid.uuid4()
    for tenant, attempts in ((tenants.b, 3), (tenants.a, 1)):
        task = await tasks.create(pool, tenant, "mail")
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, tenant, "mail.sent", {}, task_id=task.id,
                                 message_id=shared, max_attempts=attempts)  # fmt: skip
        for _ in range(attempts):
            [claimed] = await outbox.claim(pool, "relay-1")
            await outbox.mark_failed(pool, claimed, "down", backoff=timedelta(0))
    retried = await outbox.retry(pool, tenants.a, shared, actor="carol")
    assert (retried.state, retried.attempts) == ("pending", 0)
    payload = await admin_conn.fetchval(
        "SELECT payload FROM agent_events WHERE tenant_id = $1 AND event_type = 'outbox.retried'",
        tenants.a,
    )
    assert json.loads(payload)["attempts"] == 1
    other = await admin_conn.fetchrow(
        "SELECT state, attempts FROM agent_outbox WHERE tenant_id = $1 AND id = $2",
        tenants.b, shared,
    )  # fmt: skip
    assert other is not None
    assert (other["state"], other["attempts"]) == ("dead", 3)


async def test_G10_an_operator_s_retry_puts_back_the_one_message_it_names(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Two dead messages of one tenant: a retry of one puts that one back, and the other
    stays dead for its own decision. Kills generated ``gen-outbox-outbox_retry-and-2``
    (every dead message of the tenant put back)."""
    async with pool.acquire() as conn:
        dead = [
            await outbox.enqueue(conn, tenants.a, "mail.sent", {}, max_attempts=1) for _ in range(2)
        ]
    for claimed in await outbox.claim(pool, "relay-1", batch=10):
        await outbox.mark_failed(pool, claimed, "down", backoff=timedelta(0))
    assert [(await outbox.get(pool, tenants.a, m)).state for m in dead] == ["dead", "dead"]
    retried = await outbox.retry(pool, tenants.a, dead[1], actor="carol")
    assert (retried.id, retried.state) == (dead[1], "pending")
    assert (await outbox.get(pool, tenants.a, dead[0])).state == "dead"


async def test_G10_a_message_marked_delivered_cannot_then_be_marked_failed(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A relay that marked its claim delivered and then, on the same claim, failed (a
    retried callback) is told its claim is spent; the message stays delivered. Kills
    generated ``gen-outbox-outbox_mark_failed-and-3`` (a delivered message matched: the
    write then tries delivered -> pending, which the transition guard refuses with another
    error)."""
    from agentdb.errors import OutboxLeaseLost

    async with pool.acquire() as conn:
        mid = await outbox.enqueue(conn, tenants.a, "mail.sent", {})
    [claimed] = await outbox.claim(pool, "relay-1")
    assert await outbox.mark_delivered(pool, [claimed]) == {mid}
    with pytest.raises(OutboxLeaseLost):
        await outbox.mark_failed(pool, claimed, "late callback", backoff=timedelta(0))
    assert (await outbox.get(pool, tenants.a, mid)).state == "delivered"


async def test_G2_G10_a_failure_is_marked_on_its_own_tenant_s_message_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Message ids are the caller's: tenants a and b each have a message of one id, claimed
    at the same token. a's relay marks a's failed; b's is untouched. Kills generated
    ``gen-outbox-outbox_mark_failed-tenant-1`` (the failure written to both twins)."""
    shared = uuid.uuid4()
    async with pool.acquire() as conn:
        for tenant in (tenants.a, tenants.b):
            await outbox.enqueue(conn, tenant, "mail.sent", {}, message_id=shared)
    claimed = {m.tenant_id: m for m in await outbox.claim(pool, "relay-1", batch=10)}
    assert claimed[tenants.a].lease_token == claimed[tenants.b].lease_token
    await outbox.mark_failed(pool, claimed[tenants.a], "503", backoff=timedelta(0))
    b_row = await outbox.get(pool, tenants.b, shared)
    assert (b_row.attempts, b_row.last_error) == (1, None)


async def test_G10_a_relay_claims_past_the_messages_another_relay_is_claiming(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Relay a's claim of the oldest message has not committed; relay b's claim meanwhile
    takes the next message at once - it never waits for a's row (its lock timeout would end
    it if it did). Kills generated ``gen-outbox-outbox_claim-lock-2`` (SKIP LOCKED removed:
    b waits on a's row)."""
    async with pool.acquire() as conn:
        first = await outbox.enqueue(conn, tenants.a, "t", {"n": 1})
        second = await outbox.enqueue(conn, tenants.a, "t", {"n": 2})
    relay_a = await db.connect(RUNTIME)
    relay_b = await db.connect(RUNTIME)
    try:
        await relay_b.execute("SET lock_timeout = '2s'")  # it would rather fail than wait
        tx = relay_a.transaction()
        await tx.start()
        assert [m.id for m in await outbox.claim(relay_a, "relay-a", batch=1)] == [first]
        assert [m.id for m in await outbox.claim(relay_b, "relay-b", batch=10)] == [second]
        await tx.commit()
    finally:
        await relay_a.close()
        await relay_b.close()


async def test_G10_a_late_delivery_leaves_a_buried_message_dead(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A relay claimed a message on its last attempt and stopped answering; the next claim
    buried it as dead, keeping its lease token. The first relay's late mark_delivered,
    under that token, marks nothing: a dead message stays dead. Kills generated
    ``gen-outbox-outbox_mark_delivered-list-2`` ('dead' dropped from the states a mark
    passes over: the buried message marked delivered)."""
    async with pool.acquire() as conn:
        mid = await outbox.enqueue(conn, tenants.a, "t", {}, max_attempts=1)
    [late] = await outbox.claim(pool, "slow", batch=10, visibility=timedelta(milliseconds=1))
    await admin_conn.execute("SELECT pg_sleep(0.01)")
    assert await outbox.claim(pool, "next", batch=10) == []  # it is buried instead
    assert (await outbox.get(pool, tenants.a, mid)).state == "dead"
    assert await outbox.mark_delivered(pool, [late]) == set()
    assert (await outbox.get(pool, tenants.a, mid)).state == "dead"


async def test_G2_G10_a_relay_s_claim_takes_its_tenant_s_message_not_a_twin_of_its_id(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Message ids are the caller's: tenants a and b each enqueued a message of one id, a's
    first. A relay's deliver-and-claim of one message takes a's, and leaves b's as it was:
    no attempt counted. Kills generated
    ``gen-outbox-outbox_deliver_and_claim-tenant-2`` (the claim's UPDATE by id alone: b's
    twin claimed with it)."""
    shared = uuid.uuid4()
    for tenant in (tenants.a, tenants.b):
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, tenant, "t", {}, message_id=shared)
    _, claimed = await outbox.deliver_and_claim(pool, "relay", [], batch=1)
    assert [(m.tenant_id, m.id) for m in claimed] == [(tenants.a, shared)]
    twin = await outbox.get(pool, tenants.b, shared)
    assert (twin.state, twin.attempts) == ("pending", 0)
