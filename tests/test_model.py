"""A stateful model of tasks, leases, operations and the outbox across two workers (G3-G12).

Hypothesis drives random interleavings - create, claim, renew, lease expiry,
complete, release, reserve, settle, relay, worker crash - through the real
runtime on two separate worker connections, and after every step compares
Postgres with a small Python reference model:

* never two valid leases on one task; the row's lease is the one the model expects;
* ``state_version`` strictly increasing, one event per version (G7, G8);
* one operation per (tenant, key), and the answer reserve gives matches the model (G3, G4);
* every committed outbox row is delivered at least once once the relay drains (G10);
* a fenced-out worker never changes anything: its write raises and the rows stay as they were (G12);
* a cancel is final: the holder's writes raise ``Cancelled`` (never for a lease merely taken
  over), nothing is reserved for a finished task by any writer, and a finish is never undone
  (G20);
* a signal is recorded once (a replayed key answers with it), in the task's order, with one
  event; it wakes the task waiting for its name, even one that began waiting after it
  arrived; a holder reads each signal once; a finished or late task takes none (G22);
* a child is created once per key; its parent, waiting for all (or some) of its children,
  is woken exactly once, when the last of them finishes - by a finish, a cancel or the
  deadline sweep - or is due at once if they had finished before it waited (G23).

Hypothesis cannot run async rules, so a small facade owns an asyncio.Runner
and the connections; each example works in a tenant of its own.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from agentdb import children, leases, operations, outbox, signals, tasks
from agentdb.errors import (
    Cancelled,
    DeadlineExceeded,
    IdempotencyConflict,
    LeaseLost,
    OperationInFlight,
    PastDeadline,
    StaleVersion,
    TaskFinished,
)
from agentdb.models import Lease, Message, Operation, OutboxMessage
from agentdb.relay import Relay
from tests import factories as F
from tests.conftest import RUNTIME, Database

WORKERS = 2
KEYS = ("k1", "k2", "k3")
INPUTS = ({"amount": 1}, {"amount": 2})
SIGNALS = ("approval", "note")


@dataclass
class MTask:
    state: str = "pending"
    version: int = 0
    owner: str | None = None
    token: int = 0
    expired: bool = False
    late: bool = False  # its deadline has passed (G21)
    signals: list[str] = field(default_factory=list)  # names, in seq order (G22)
    keys: dict[str, int] = field(default_factory=dict)  # dedupe key -> seq
    cursor: int = 0
    wait_for: str | None = None
    due: bool = False  # waiting, but due at once (its signal, or its children, had arrived)
    parent: uuid.UUID | None = None  # G23
    kids: list[uuid.UUID] = field(default_factory=list)
    wait_children: int | None = None
    wakes: int = 0  # task.children_done events


@dataclass
class MOp:
    op: Operation
    input_index: int
    state: str = "reserved"


@dataclass
class Model:
    tasks: dict[uuid.UUID, MTask] = field(default_factory=dict)
    ops: dict[str, MOp] = field(default_factory=dict)
    committed: set[uuid.UUID] = field(default_factory=set)
    delivered: set[uuid.UUID] = field(default_factory=set)


class Harness:
    """Sync facade over the async runtime: one runner, connections made once."""

    def __init__(self, db: Database) -> None:
        self.runner = asyncio.Runner()
        self.db = db
        self.conns: list[asyncpg.Connection] = [
            self.run(db.connect(RUNTIME)) for _ in range(WORKERS)
        ]
        self.admin: asyncpg.Connection = self.run(db.connect())
        self.pool: asyncpg.Pool = self.run(
            asyncpg.create_pool(db.url(RUNTIME), min_size=1, max_size=2)
        )

    def run(self, aw: Any) -> Any:
        async def wrap() -> Any:
            return await aw

        return self.runner.run(wrap())

    def reconnect(self, w: int) -> None:
        self.run(self.conns[w].close())
        self.conns[w] = self.run(self.db.connect(RUNTIME))

    def close(self) -> None:
        for c in self.conns:
            self.run(c.close())
        self.run(self.admin.close())
        self.run(self.pool.close())
        self.runner.close()


def run_machine(h: Harness, *, max_examples: int) -> None:  # noqa: C901 - the model is one class
    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tenant = uuid.uuid4()
            h.run(
                h.admin.execute(
                    "INSERT INTO agent_tenants (id, name) VALUES ($1, 'model ' || $1::uuid::text)",
                    self.tenant,
                )
            )
            self.m = Model()
            # A task type of its own: claims never reach earlier examples' leftovers.
            self.kind = f"model-{self.tenant.hex[:12]}"
            # What each worker believes it holds: task -> (lease, version at its last write).
            self.held: list[dict[uuid.UUID, tuple[Lease, int]]] = [{} for _ in range(WORKERS)]

        # ---- helpers -----------------------------------------------------------------

        def current(self, w: int, task_id: uuid.UUID) -> bool:
            t = self.m.tasks[task_id]
            lease, _ = self.held[w][task_id]
            return t.state == "running" and t.owner == lease.owner and t.token == lease.token

        def snapshot(self) -> list[Any]:
            rows = h.run(h.admin.fetch(
                "SELECT id, state, state_version, lease_owner, lease_token, lease_expires_at"
                " FROM agent_tasks WHERE tenant_id = $1 ORDER BY id", self.tenant))  # fmt: skip
            ops = h.run(h.admin.fetch(
                "SELECT id, state, state_version FROM agent_operations WHERE tenant_id = $1"
                " ORDER BY id", self.tenant))  # fmt: skip
            return [list(map(tuple, rows)), list(map(tuple, ops))]

        def refused_and_unchanged(self, call: Any, *errors: type[Exception]) -> Exception:
            before = self.snapshot()
            try:
                h.run(call)
            except errors as exc:
                refused = exc
            else:
                raise AssertionError("a fenced-out write was accepted")
            assert self.snapshot() == before, "a refused write changed something"
            return refused

        def lease_refused(
            self, tid: uuid.UUID, lease: Lease, call: Any, *also: type[Exception]
        ) -> None:
            """A holder's write refused: ``Cancelled`` exactly when the task was cancelled
            under this holder's lease, ``PastDeadline`` exactly when the deadline sweep ended
            it under this lease. A holder another worker took the task over from before that
            only lost its lease (a plain ``LeaseLost``): the cancel or the sweep was not of
            its attempt."""
            refused = self.refused_and_unchanged(call, LeaseLost, *also)
            if isinstance(refused, LeaseLost):
                mt = self.m.tasks[tid]
                ours = lease.token == mt.token
                cancelled = ours and mt.state == "cancelled"
                swept = ours and mt.state == "dead" and mt.late
                assert isinstance(refused, Cancelled) == cancelled, (refused, cancelled)
                assert isinstance(refused, PastDeadline) == swept, (refused, swept)

        def finished(self, tid: uuid.UUID) -> None:
            """The database's fan-in after task ``tid`` finished (G23)."""
            parent = self.m.tasks[tid].parent
            if parent is None:
                return
            pt = self.m.tasks[parent]
            done = sum(self.m.tasks[k].state in tasks.FINISHED_STATES for k in pt.kids)
            waits = pt.state == "waiting" and pt.wait_children is not None and not pt.late
            if waits and done >= (pt.wait_children or 0):
                pt.state, pt.version, pt.wait_children = "pending", pt.version + 1, None
                pt.due, pt.wakes = False, pt.wakes + 1

        def pick_held(self, data: st.DataObject, w: int) -> uuid.UUID:
            # In the order taken: a replay draws the same task whatever its random id.
            return data.draw(st.sampled_from(list(self.held[w])))

        # ---- rules -------------------------------------------------------------------

        @rule()
        def create(self) -> None:
            t = h.run(tasks.create(h.pool, self.tenant, self.kind, max_attempts=1000))
            self.m.tasks[t.id] = MTask()

        @rule(w=st.integers(0, WORKERS - 1))
        def claim(self, w: int) -> None:
            claimable = {
                tid for tid, t in self.m.tasks.items()
                if not t.late and (t.state == "pending" or (t.state == "waiting" and t.due)
                                   or (t.state == "running" and t.expired))
            }  # fmt: skip
            got = h.run(
                leases.claim(
                    h.conns[w], f"w{w}", lease_ttl=timedelta(minutes=5), task_types=[self.kind]
                )
            )
            if not claimable:
                assert got == []
                return
            assert len(got) == 1
            task = got[0]
            assert task.id in claimable
            mt = self.m.tasks[task.id]
            mt.state, mt.version, mt.owner, mt.token, mt.expired = (
                "running", mt.version + 1, f"w{w}", mt.token + 1, False,
            )  # fmt: skip
            mt.wait_for, mt.due, mt.wait_children = None, False, None
            assert (task.state_version, task.lease_token) == (mt.version, mt.token)
            assert task.lease is not None
            self.held[w][task.id] = (task.lease, task.state_version)

        @rule(task_id=st.data())
        def expire(self, task_id: st.DataObject) -> None:
            # (A late one cannot even be given an expired lease: G21 refuses the write.)
            running = [t for t, mt in self.m.tasks.items() if mt.state == "running" and not mt.late]
            if not running:
                return
            tid = task_id.draw(st.sampled_from(running))
            h.run(F.expire_lease(h.admin, tid))
            self.m.tasks[tid].expired = True

        @rule(w=st.integers(0, WORKERS - 1), data=st.data())
        def renew(self, w: int, data: st.DataObject) -> None:
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, version = self.held[w][tid]
            if self.current(w, tid) and self.m.tasks[tid].late:
                self.refused_and_unchanged(leases.renew(h.conns[w], lease), DeadlineExceeded)
            elif self.current(w, tid):
                renewed = h.run(leases.renew(h.conns[w], lease))
                self.held[w][tid] = (renewed, version)
                self.m.tasks[tid].expired = False
            else:
                self.lease_refused(tid, lease, leases.renew(h.conns[w], lease))

        @rule(
            w=st.integers(0, WORKERS - 1), data=st.data(),
            end=st.sampled_from(("succeeded", "failed", "dead")),
        )  # fmt: skip
        def complete(self, w: int, data: st.DataObject, end: str) -> None:
            """The holder finishes the task: a success with its outbox message, or a failure
            (failed, or dead when it will not be tried again) - a child that ends other than
            by success wakes its waiting parent all the same (G23, issue 35)."""
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, version = self.held[w][tid]
            msg = Message("done", {"task": str(tid)})
            call = tasks.transition(
                h.conns[w], self.tenant, tid, expected_version=version, to_state=end,
                lease=lease, outbox=[msg] if end == "succeeded" else (),
                error=None if end == "succeeded" else "the model's failure",
            )  # fmt: skip
            mt = self.m.tasks[tid]
            if self.current(w, tid) and mt.late and mt.version == version and end != "dead":
                self.refused_and_unchanged(call, DeadlineExceeded)
            elif self.current(w, tid) and mt.version == version:
                h.run(call)
                mt.state, mt.version, mt.owner = end, mt.version + 1, None
                self.finished(tid)
                if end == "succeeded":
                    self.m.committed.add(msg.id)
                del self.held[w][tid]
            elif self.current(w, tid):  # its lease holds, its version does not (late or not)
                self.refused_and_unchanged(call, StaleVersion)
            else:
                self.lease_refused(tid, lease, call)

        @rule(w=st.integers(0, WORKERS - 1), data=st.data())
        def release(self, w: int, data: st.DataObject) -> None:
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, _ = self.held[w][tid]
            if self.current(w, tid) and self.m.tasks[tid].late:
                self.refused_and_unchanged(leases.release(h.conns[w], lease), DeadlineExceeded)
            elif self.current(w, tid):
                h.run(leases.release(h.conns[w], lease))
                mt = self.m.tasks[tid]
                mt.state, mt.version, mt.owner, mt.expired = "pending", mt.version + 1, None, False
                del self.held[w][tid]
            else:
                self.lease_refused(tid, lease, leases.release(h.conns[w], lease))

        @rule(
            w=st.integers(0, WORKERS - 1),
            key=st.sampled_from(KEYS),
            i=st.integers(0, 1),
            data=st.data(),
        )
        def reserve(self, w: int, key: str, i: int, data: st.DataObject) -> None:
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, _ = self.held[w][tid]
            call = operations.reserve(
                h.conns[w], self.tenant, tid, key, "pay", INPUTS[i], lease=lease
            )
            if not self.current(w, tid):
                self.lease_refused(tid, lease, call)
                return
            known = self.m.ops.get(key)
            if known is None and self.m.tasks[tid].late:
                self.refused_and_unchanged(call, DeadlineExceeded)  # no new effect
            elif known is None:
                res = h.run(call)
                assert res.fresh
                self.m.ops[key] = MOp(res.operation, i)
            elif known.input_index != i:
                self.refused_and_unchanged(call, IdempotencyConflict)
            elif known.state == "reserved":
                self.refused_and_unchanged(call, OperationInFlight)
            else:
                res = h.run(call)
                assert not res.fresh
                assert res.operation.id == known.op.id

        @rule(w=st.integers(0, WORKERS - 1), key=st.sampled_from(KEYS))
        def settle(self, w: int, key: str) -> None:
            known = self.m.ops.get(key)
            if known is None or known.state != "reserved":
                return
            task_id = known.op.task_id
            lease = self.held[w].get(task_id, (None, 0))[0]
            if lease is None:
                return
            call = operations.complete(h.conns[w], known.op, result={"ok": True}, lease=lease)
            if self.current(w, task_id):
                known.op = h.run(call)
                known.state = "succeeded"
            else:
                self.lease_refused(task_id, lease, call)

        @rule(data=st.data())
        def cancel(self, data: st.DataObject) -> None:
            if not self.m.tasks:
                return
            # In creation order: a replay draws the same task whatever its random id.
            tid = data.draw(st.sampled_from(list(self.m.tasks)))
            mt = self.m.tasks[tid]
            got = h.run(tasks.cancel(h.pool, self.tenant, tid, reason="model"))
            if mt.state not in tasks.FINISHED_STATES:  # a finish is never undone
                mt.state, mt.version, mt.owner, mt.expired = (
                    "cancelled",
                    mt.version + 1,
                    None,
                    False,
                )
                self.finished(tid)
            assert (got.state, got.state_version) == (mt.state, mt.version)

        @rule(data=st.data())
        def reserve_for_a_finished_task(self, data: st.DataObject) -> None:
            """Without a lease, as a raw writer would: the database refuses a finished task
            (AG012) and a late one (AG013)."""
            over = [
                t for t, mt in self.m.tasks.items()
                if mt.state in tasks.FINISHED_STATES or mt.late
            ]  # fmt: skip
            if not over:
                return
            tid = data.draw(st.sampled_from(over))
            call = operations.reserve(
                h.pool, self.tenant, tid, f"late-{uuid.uuid4().hex[:8]}", "pay", INPUTS[0]
            )
            finished = self.m.tasks[tid].state in tasks.FINISHED_STATES
            self.refused_and_unchanged(call, TaskFinished if finished else DeadlineExceeded)

        @rule(data=st.data(), reload=st.booleans())
        def deadline_passes(self, data: st.DataObject, reload: bool) -> None:
            """An unfinished task's deadline is moved into the past (a versioned raw write);
            ``reload``: its holder, if any, reloads the task and so expects the new version."""
            alive = [
                t for t, mt in self.m.tasks.items()
                if mt.state not in tasks.FINISHED_STATES and not mt.late
            ]  # fmt: skip
            if not alive:
                return
            tid = data.draw(st.sampled_from(alive))
            mt = self.m.tasks[tid]
            past = datetime.now(UTC) - timedelta(hours=1)
            h.run(F.update_task(h.admin, self.tenant, tid, deadline_at=past,
                                state_version=mt.version + 1))  # fmt: skip
            mt.version, mt.late = mt.version + 1, True
            for held in self.held:
                if reload and tid in held:
                    held[tid] = (held[tid][0], mt.version)

        @rule()
        def sweep(self) -> None:
            got = h.run(leases.expire_deadlines(h.pool, batch=1000))
            mine = {t for tenant, t in got if tenant == self.tenant}
            due = {
                t for t, mt in self.m.tasks.items()
                if mt.late and mt.state not in tasks.FINISHED_STATES
            }  # fmt: skip
            assert mine == due
            for tid in due:
                mt = self.m.tasks[tid]
                mt.state, mt.version, mt.owner = "dead", mt.version + 1, None
            for tid in sorted(due, key=list(self.m.tasks).index):
                self.finished(tid)

        @rule(data=st.data(), name=st.sampled_from(SIGNALS), replay=st.booleans())
        def signal(self, data: st.DataObject, name: str, replay: bool) -> None:
            """A signal from outside, with a dedupe key - or a replay of an earlier one."""
            if not self.m.tasks:
                return
            tid = data.draw(st.sampled_from(list(self.m.tasks)))
            mt = self.m.tasks[tid]
            if replay and mt.keys:
                key = data.draw(st.sampled_from(list(mt.keys)))
                got = h.run(signals.signal(h.pool, self.tenant, tid, mt.signals[mt.keys[key] - 1],
                                           dedupe_key=key))  # fmt: skip
                assert (got.created, got.seq) == (False, mt.keys[key])  # whatever the task does
                return
            key = f"s{len(mt.keys)}"
            call = signals.signal(h.pool, self.tenant, tid, name, dedupe_key=key)
            if mt.state in tasks.FINISHED_STATES or mt.late:
                finished = mt.state in tasks.FINISHED_STATES
                self.refused_and_unchanged(call, TaskFinished if finished else DeadlineExceeded)
                return
            got = h.run(call)
            mt.signals.append(name)
            mt.keys[key] = got.seq
            assert (got.created, got.seq) == (True, len(mt.signals))
            if mt.state == "waiting" and mt.wait_for == name:
                mt.state, mt.version, mt.wait_for, mt.due = "pending", mt.version + 1, None, False

        @rule(w=st.integers(0, WORKERS - 1), data=st.data(), name=st.sampled_from(SIGNALS),
              read=st.booleans())  # fmt: skip
        def wait_for_signal(self, w: int, data: st.DataObject, name: str, read: bool) -> None:
            """The holder reads its unread signals (or not) and waits for one named ``name``."""
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, version = self.held[w][tid]
            mt = self.m.tasks[tid]
            if not self.current(w, tid) or mt.version != version:
                return  # fenced-out writes are the other rules' business
            upto = None
            if read:
                unread = h.run(signals.unread(h.conns[w], self.tenant, tid))
                assert [(s.seq, s.name) for s in unread] == [
                    (n, mt.signals[n - 1]) for n in range(mt.cursor + 1, len(mt.signals) + 1)
                ], "a signal read twice, or one not there to read"
                upto = unread[-1].seq if unread else None
            call = tasks.transition(
                h.conns[w], self.tenant, tid, expected_version=version, to_state="waiting",
                lease=lease, wait_signal=name, signals_read=upto,
            )  # fmt: skip
            if mt.late:
                self.refused_and_unchanged(call, DeadlineExceeded)
                return
            h.run(call)
            mt.cursor = upto or mt.cursor
            mt.state, mt.version, mt.owner, mt.expired = "waiting", mt.version + 1, None, False
            mt.wait_for, mt.due = name, name in mt.signals[mt.cursor :]
            mt.wait_children = None
            del self.held[w][tid]

        @rule(w=st.integers(0, WORKERS - 1), data=st.data(), replay=st.booleans())
        def spawn(self, w: int, data: st.DataObject, replay: bool) -> None:
            """The holder creates a child (or, ``replay``, one it created before)."""
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            mt = self.m.tasks[tid]
            if not self.current(w, tid):
                return
            parent = h.run(tasks.get(h.pool, self.tenant, tid))
            if mt.late:  # G21: no child past the deadline, not even one created before it
                key = "new"
                if replay and mt.kids:
                    key = f"c{data.draw(st.integers(0, len(mt.kids) - 1))}"
                call = children.spawn(h.pool, parent, self.kind, key, max_attempts=1000)
                self.refused_and_unchanged(call, DeadlineExceeded)
                return
            if replay and mt.kids:
                i = data.draw(st.integers(0, len(mt.kids) - 1))
                got = h.run(children.spawn(h.pool, parent, self.kind, f"c{i}", max_attempts=1000))
                assert (got.created, got.id) == (False, mt.kids[i])
                return
            got = h.run(children.spawn(h.pool, parent, self.kind, f"c{len(mt.kids)}",
                                       max_attempts=1000))  # fmt: skip
            assert got.created
            mt.kids.append(got.id)
            self.m.tasks[got.id] = MTask(parent=tid)

        @rule(w=st.integers(0, WORKERS - 1), data=st.data(), quorum=st.booleans())
        def wait_for_children(self, w: int, data: st.DataObject, quorum: bool) -> None:
            """The holder waits for all its children, or (``quorum``) for one of them."""
            if not self.held[w]:
                return
            tid = self.pick_held(data, w)
            lease, version = self.held[w][tid]
            mt = self.m.tasks[tid]
            if not self.current(w, tid) or mt.version != version or not mt.kids:
                return
            want = 1 if quorum else len(mt.kids)
            call = tasks.transition(
                h.conns[w], self.tenant, tid, expected_version=version, to_state="waiting",
                lease=lease, wait_children=want,
            )  # fmt: skip
            if mt.late:
                self.refused_and_unchanged(call, DeadlineExceeded)
                return
            h.run(call)
            done = sum(self.m.tasks[k].state in tasks.FINISHED_STATES for k in mt.kids)
            mt.state, mt.version, mt.owner, mt.expired = "waiting", mt.version + 1, None, False
            mt.wait_children, mt.wait_for, mt.due = want, None, done >= want
            del self.held[w][tid]

        @rule(w=st.integers(0, WORKERS - 1))
        def crash(self, w: int) -> None:
            """The worker process dies and restarts; what it believed it held is now stale."""
            h.reconnect(w)

        @rule()
        def relay(self) -> None:
            seen: list[uuid.UUID] = []

            async def publish(message: OutboxMessage) -> None:
                seen.append(message.id)

            h.run(Relay(h.pool, publish).drain())
            self.m.delivered |= set(seen)
            assert self.m.committed <= self.m.delivered, "a committed message was not delivered"

        # ---- invariants ----------------------------------------------------------------

        @invariant()
        def rows_match_the_model(self) -> None:
            rows = h.run(h.admin.fetch(
                "SELECT id, state, state_version, lease_owner, lease_token FROM agent_tasks"
                " WHERE tenant_id = $1", self.tenant))  # fmt: skip
            assert {r["id"]: (r["state"], r["state_version"], r["lease_owner"], r["lease_token"])
                    for r in rows} == {
                tid: (t.state, t.version, t.owner if t.state == "running" else None, t.token)
                for tid, t in self.m.tasks.items()
            }  # fmt: skip

        @invariant()
        def never_two_valid_leases(self) -> None:
            for tid in self.m.tasks:
                holders = [
                    w for w in range(WORKERS) if tid in self.held[w] and self.current(w, tid)
                ]
                assert len(holders) <= 1

        @invariant()
        def one_event_per_version(self) -> None:
            rows = h.run(h.admin.fetch(
                "SELECT t.id, t.state_version, count(DISTINCT e.task_state_version) AS n,"
                " min(e.task_state_version) AS lo, max(e.task_state_version) AS hi"
                " FROM agent_tasks t JOIN agent_events e ON e.tenant_id = t.tenant_id"
                " AND e.task_id = t.id AND e.task_state_version IS NOT NULL"
                " WHERE t.tenant_id = $1 GROUP BY t.id, t.state_version", self.tenant))  # fmt: skip
            assert len(rows) == len(self.m.tasks)
            for r in rows:
                assert (r["n"], r["lo"], r["hi"]) == (r["state_version"] + 1, 0, r["state_version"])

        @invariant()
        def signals_match_the_model(self) -> None:
            rows = h.run(h.admin.fetch(
                "SELECT t.id, t.signal_cursor, coalesce(array_agg(s.name ORDER BY s.seq)"
                " FILTER (WHERE s.seq IS NOT NULL), '{}') AS names,"
                " (SELECT count(*) FROM agent_events e WHERE e.tenant_id = t.tenant_id"
                "  AND e.task_id = t.id AND e.event_type = 'task.signalled') AS events"
                " FROM agent_tasks t LEFT JOIN agent_signals s"
                " ON s.tenant_id = t.tenant_id AND s.task_id = t.id"
                " WHERE t.tenant_id = $1 GROUP BY t.tenant_id, t.id", self.tenant))  # fmt: skip
            assert {r["id"]: (r["signal_cursor"], list(r["names"]), r["events"]) for r in rows} == {
                tid: (t.cursor, t.signals, len(t.signals)) for tid, t in self.m.tasks.items()
            }, "a signal lost, doubled, unaudited or read out of turn"

        @invariant()
        def each_parent_woken_once_per_wait(self) -> None:
            rows = h.run(h.admin.fetch(
                "SELECT t.id, t.parent_id, (SELECT count(*) FROM agent_events e"
                " WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id"
                " AND e.event_type = 'task.children_done') AS wakes"
                " FROM agent_tasks t WHERE t.tenant_id = $1", self.tenant))  # fmt: skip
            assert {r["id"]: (r["parent_id"], r["wakes"]) for r in rows} == {
                tid: (t.parent, t.wakes) for tid, t in self.m.tasks.items()
            }, "a parent woken twice, or not at all, or a child under the wrong parent"

        @invariant()
        def one_operation_per_key(self) -> None:
            n = h.run(
                h.admin.fetchval(
                    "SELECT count(*) FROM agent_operations WHERE tenant_id = $1", self.tenant
                )
            )
            assert n == len(self.m.ops)

        @invariant()
        def nothing_delivered_that_was_not_committed(self) -> None:
            assert self.m.delivered <= self.m.committed | self._foreign_messages()

        def _foreign_messages(self) -> set[uuid.UUID]:
            # Earlier examples' undelivered rows (other tenants) may ride along in a drain.
            rows = h.run(
                h.admin.fetch("SELECT id FROM agent_outbox WHERE tenant_id <> $1", self.tenant)
            )
            return {r["id"] for r in rows}

    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_G3_G4_G7_G8_G10_G12_G22_G23_stateful_model_of_two_workers(db: Database) -> None:
    h = Harness(db)
    try:
        run_machine(h, max_examples=200)
    finally:
        h.close()


_ = outbox  # the relay reads the outbox through agentdb.outbox
