"""The outbox relay: deliver committed messages at least once (G10, G11).

Claims pending rows (SKIP LOCKED, under a lease with a visibility timeout),
publishes each through a user-supplied async publisher *outside* any
transaction - the message id is the idempotency key to hand downstream -,
marks the delivered ones in one statement, and backs off the failed ones
until they go 'dead' after their last attempt. After a full batch (more is
probably due) the mark and the next claim are one statement
(:func:`agentdb.outbox.deliver_and_claim`): one round trip and one commit
per batch under load; after a short one the mark goes alone, at once. A crash between publishing
and marking means the message is published again: consumers dedupe with
:mod:`agentdb.inbox`. LISTEN/NOTIFY only shortens the wait; polling alone
is enough (e.g. behind a transaction-pooling proxy).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from agentdb import _db, _faults, outbox, schema, telemetry
from agentdb._db.jsonb import TEXT_CAP
from agentdb._db.pool import pooler_mode
from agentdb._runtime import backoff, describe, is_async_callable, nap, owner_id, wakeups
from agentdb.errors import AgentDBError, ConfigurationError, TransientError
from agentdb.models import OutboxMessage

__all__ = ["Publisher", "Relay", "RelayStats"]

log = logging.getLogger("agentdb.relay")

#: ``async def publish(message) -> None``; raise to report a failed delivery.
Publisher = Callable[[OutboxMessage], Awaitable[None]]


@dataclass
class RelayStats:
    claimed: int = 0
    delivered: int = 0
    failed_attempts: int = 0
    dead: int = 0
    lost_claims: int = 0


#: The share of a claim's visibility its publishes may take; the rest records them.
_PUBLISH_SHARE = 0.8


class Relay:
    """Moves outbox rows to ``publisher``; run one or several (they never share a row).

    A batch's publishes get 80 % of ``visibility`` (the lease of its claim): a
    publish still running then is cancelled and recorded as failed, to be tried
    again after its backoff - never left running while another relay, the lease
    over, publishes the same message. A slow broker needs a longer visibility.

    ``listen_dsn`` and ``pooler`` work as for :class:`agentdb.worker.Worker`.

    Raises:
        ConfigurationError: a batch or concurrency under 1, a poll interval of 0 or less (a
            busy loop), a visibility under a second, or a retry base of 0 or less.
    """

    def __init__(
        self,
        pool: _db.Pool,
        publisher: Publisher,
        *,
        relay_id: str | None = None,
        batch: int = 100,
        visibility: timedelta = timedelta(seconds=30),
        publish_concurrency: int = 16,
        poll_interval: float = 1.0,
        listen_dsn: str | None = None,
        pooler: str | None = None,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
    ) -> None:
        if batch < 1 or publish_concurrency < 1:
            raise ConfigurationError("batch and publish_concurrency must be at least 1")
        if not poll_interval > 0:  # also catches NaN
            raise ConfigurationError("poll_interval must be more than 0 seconds")
        if not is_async_callable(publisher):
            raise ConfigurationError(
                "the publisher must be an async callable: async def publish(m)"
            )
        if visibility < timedelta(seconds=1):
            raise ConfigurationError("visibility must be at least 1 second")
        if not retry_base > 0 or not retry_cap >= retry_base:
            raise ConfigurationError("retry_base must be more than 0 and retry_cap at least that")
        self.pool = pool
        self.publisher = publisher
        self.relay_id = relay_id or owner_id("relay")
        self.batch = batch
        self.visibility = visibility
        self.poll_interval = poll_interval
        # Behind a transaction pooler LISTEN cannot outlive a transaction: poll only.
        self.listen_dsn = None if pooler_mode(pooler) == "transaction" else listen_dsn
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.stats = RelayStats()
        self.publish_concurrency = publish_concurrency
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # Where the next claim starts on Citus (claimed tenant by tenant).
        self._claim_after: uuid.UUID | None = None
        # Claimed by the last round's mark (deliver_and_claim), not yet published.
        self._next: list[OutboxMessage] = []

    def stop(self) -> None:
        """Stop after the batch in hand is marked."""
        self._stopping.set()
        self._wake.set()

    async def drain(self) -> int:
        """Deliver until nothing is due; return how many messages were delivered."""
        before = self.stats.delivered
        while await self.run_once():
            pass
        return self.stats.delivered - before

    async def run_once(self) -> int:
        """Claim, publish and mark one batch; return how many were claimed.

        The batch is the one the previous round's mark claimed, if it did. A
        claim that only buried messages (used their attempts: see
        :func:`agentdb.outbox.claim`) returns how many it buried, as more may
        be due behind them.
        """
        claimed, self._next = self._next, []
        if not claimed:
            try:
                claimed, buried = await outbox._claim(
                    self.pool, self.relay_id, self.batch, self.visibility, self._claim_after
                )
            except (TransientError, OSError) as exc:
                log.warning("claim failed, retrying: %s", exc)
                return 0
            self.stats.dead += buried
            if not claimed:
                return buried  # more may be due behind what was buried
            self._count_claim(claimed)
        _faults.point("after_relay_claim")
        # A publish still running when the claim's visibility ends could no longer be
        # recorded (another relay may have the message by then, and publish it too):
        # it is cut off before, with time left to record its failure.
        deadline = asyncio.get_running_loop().time() + (
            self.visibility.total_seconds() * _PUBLISH_SHARE
        )
        results = await self._publish_all(claimed, deadline)
        ok = [m for m, error in zip(claimed, results, strict=True) if error is None]
        if ok:
            _faults.point("after_publish")
        # Failures first: backed off (not due) before a merged claim could lease
        # them again and fence their own record out.
        await self._record_failures(claimed, results)
        marked: set[uuid.UUID] | None = None
        if len(claimed) >= self.batch and not self._stopping.is_set():
            # A full batch: more is probably due. Mark and claim the next at once.
            try:
                marked, self._next, buried = await outbox._deliver_and_claim(
                    self.pool, self.relay_id, ok, self.batch, self.visibility,
                    self._claim_after,
                )  # fmt: skip
                self.stats.dead += buried
            except (TransientError, OSError) as exc:
                # As a failed claim is: logged, retried - the mark alone, at once.
                log.warning("mark and claim failed, marking alone: %s", exc)
            if self._next:
                self._count_claim(self._next)
        if marked is None:
            marked = await outbox.mark_delivered(self.pool, ok)
        self.stats.delivered += len(marked)
        self.stats.lost_claims += len(ok) - len(marked)
        return len(claimed)

    async def _record_failures(
        self, claimed: list[OutboxMessage], results: list[str | None]
    ) -> None:
        """Back off each message whose publish failed (dead after its last attempt)."""
        for m, error in zip(claimed, results, strict=True):
            if error is None:
                continue
            self.stats.failed_attempts += 1
            delay = backoff(m.attempts, base=self.retry_base, cap=self.retry_cap)
            try:
                failure = await outbox.mark_failed(self.pool, m, error, backoff=delay)
            except AgentDBError as exc:
                self.stats.lost_claims += 1
                log.warning("message %s: could not record the failure: %s", m.id, exc)
                continue
            if failure.state == "dead":
                self.stats.dead += 1
                log.error(
                    "message %s (%s) is dead after %d attempts: %s",
                    m.id,
                    m.topic,
                    failure.attempts,
                    error,
                )

    def _count_claim(self, claimed: list[OutboxMessage]) -> None:
        self._claim_after = claimed[-1].tenant_id
        self.stats.claimed += len(claimed)

    async def _publish_all(self, claimed: list[OutboxMessage], deadline: float) -> list[str | None]:
        """Publish ``claimed``, ``publish_concurrency`` at a time; each one's error or None.

        A few lanes take the messages in turn: one asyncio task per lane, not
        per message (a task costs more than a fast publisher's call).
        """
        # Not published until a lane says so: a message no lane reached is never
        # marked delivered.
        errors: list[str | None] = ["not published"] * len(claimed)
        turns = iter(range(len(claimed)))

        async def lane() -> None:
            for i in turns:
                errors[i] = await self._publish(claimed[i], deadline)

        lanes = max(1, min(self.publish_concurrency, len(claimed)))
        if lanes == 1:
            await lane()
        else:
            await asyncio.gather(*(lane() for _ in range(lanes)))
        return errors

    async def _publish(self, message: OutboxMessage, deadline: float) -> str | None:
        attrs = {
            "agentdb.tenant_id": message.tenant_id,
            "agentdb.message_id": message.id,
            "messaging.destination.name": message.topic,
        }
        try:
            async with asyncio.timeout_at(deadline):
                with telemetry.span("agentdb.relay.publish", attrs):
                    await self.publisher(message)
        except TimeoutError as exc:
            if asyncio.get_running_loop().time() < deadline:
                error = describe(exc)  # the publisher's own timeout
            else:
                error = (
                    f"TimeoutError: not published within {_PUBLISH_SHARE:.0%} of the "
                    f"visibility ({self.visibility}); left for another try"
                )
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the relay is being stopped
            error = describe(
                asyncio.CancelledError("the publisher was cancelled, not by the relay")
            )
        except BaseException as exc:
            # Any other BaseException of the publisher (SystemExit, GeneratorExit, its
            # own) is a failed publish too: raised, it ended the relay, and every relay
            # that claimed the message after it.
            error = describe(exc)
        else:
            return None
        log.warning("publish of %s (%s) failed, attempt %d of %d: %s", message.id,
                    message.topic, message.attempts, message.max_attempts, error)  # fmt: skip
        return error[:TEXT_CAP]

    async def run(self, *, install_signals: bool = True) -> RelayStats:
        """Run until :meth:`stop` (or SIGTERM / SIGINT when ``install_signals``).

        Raises:
            MigrationError: the schema is older than this code (checked before any claim).
        """
        await schema.check(self.pool)
        async with wakeups(
            dsn=self.listen_dsn,
            channel="agentdb_outbox",
            wake=self._wake,
            poll_interval=self.poll_interval,
            stop=self.stop,
            install_signals=install_signals,
        ):
            log.info("relay %s started", self.relay_id)
            while not self._stopping.is_set():
                self._wake.clear()
                if await self.run_once() >= self.batch:
                    continue  # a full batch: more are probably due
                await nap(self._wake, self.poll_interval)
            while self._next:  # claimed by the last mark before the stop: deliver them
                await self.run_once()
        log.info("relay %s stopped: %s", self.relay_id, self.stats)
        return self.stats
