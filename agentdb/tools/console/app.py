"""The console's routes: pages per tenant, the approvals inbox, the effect ledger, dead
messages, and the actions on them - each in a transaction scoped to one tenant.

The console connects as a login that is a member of ``agentdb_operator``
(:mod:`agentdb.tools.console.command` refuses the owner, a superuser, or a
role that bypasses row-level security), and opens every transaction with
:func:`agentdb.tenancy.tenant_scope` for a tenant the signed-in principal may
see: a request for another tenant is answered 404 before it reaches the
database, and a request that names another tenant's task under one of its
own finds nothing there, because the database shows it nothing else. Every
action is the library's guarded statement with the principal as the actor;
what the database refuses (an approval by a lease holder, G22; a retry of a
cancelled task) comes back as the error on the page.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from agentdb import _db, operations, outbox, overview, signals, tasks, tenancy
from agentdb.errors import AgentDBError, ConfigurationError, NotFound
from agentdb.tools.console.auth import Principal, Sessions
from agentdb.tools.console.pages import (
    age,
    budget_bar,
    chart,
    form,
    h,
    layout,
    pretty,
    table,
)
from agentdb.tools.operate import database_refusal

__all__ = ["build_app"]

Handler = Callable[[Request], Awaitable[Response]]
_DECISIONS = {"approve": "approved", "reject": "rejected"}


def build_app(
    pool_factory: Callable[[], Awaitable[_db.Pool]],
    principals: list[Principal],
    *,
    secure_cookies: bool = False,
    live_interval: float = 1.0,
) -> Starlette:
    """The console as an ASGI app; ``pool_factory`` opens its pool at start-up."""
    return _Console(pool_factory, principals, secure_cookies, live_interval).app()


class _Console:
    """The routes, over one pool and one set of principals."""

    def __init__(
        self,
        pool_factory: Callable[[], Awaitable[_db.Pool]],
        principals: list[Principal],
        secure_cookies: bool,
        live_interval: float,
    ) -> None:
        self.pool_factory = pool_factory
        self.sessions = Sessions(principals)
        self.state: dict[str, Any] = {}
        self.secure_cookies = secure_cookies
        self.live_interval = live_interval

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.state["pool"] = await self.pool_factory()
        try:
            yield
        finally:
            await self.state["pool"].close()

    def pool(self) -> _db.Pool:
        p: _db.Pool = self.state["pool"]
        return p

    # ---- self.sessions -----------------------------------------------------------------

    def who(self, request: Request) -> Principal | None:
        return self.sessions.principal(request.cookies.get(Sessions.COOKIE))

    def csrf_of(self, request: Request) -> str:
        return self.sessions.csrf(request.cookies.get(Sessions.COOKIE, ""))

    def page(self, request: Request, title: str, body: str, status: int = 200) -> HTMLResponse:
        principal = self.who(request)
        return HTMLResponse(
            layout(
                title,
                body,
                who=principal.name if principal else None,
                csrf=self.csrf_of(request),
                flash=request.query_params.get("msg"),
                error=request.query_params.get("error"),
                fingerprint=getattr(request.state, "fingerprint", ""),
            ),
            status_code=status,
        )

    def signed_in(self, handler: Callable[[Request, Principal], Awaitable[Response]]) -> Handler:
        async def wrapped(request: Request) -> Response:
            principal = self.who(request)
            if principal is None:
                if request.method == "POST":
                    return PlainTextResponse("not signed in", status_code=401)
                return RedirectResponse("/login", status_code=303)
            if request.method == "GET" and request.url.path != "/live":
                # Taken before the page reads anything: a change after it, however
                # soon, differs from what the page's live listener starts from.
                request.state.fingerprint = await _fingerprint(self.pool(), principal)
            if request.method == "POST":
                form_data = await request.form()
                token = form_data.get("csrf")
                if not self.sessions.csrf_ok(
                    request.cookies.get(Sessions.COOKIE), token if isinstance(token, str) else None
                ):
                    return PlainTextResponse("refused: CSRF token missing or wrong", 403)
            return await handler(request, principal)

        return wrapped

    def tenant_of(self, request: Request, principal: Principal) -> uuid.UUID:
        try:
            tenant = uuid.UUID(request.path_params["tenant"])
        except ValueError:
            raise HTTPException(404, "no such tenant") from None
        if not principal.may_see(tenant):
            raise HTTPException(404, "no such tenant")  # not "forbidden": not even that it exists
        return tenant

    def back(
        self, to: str, *, msg: str | None = None, error: str | None = None
    ) -> RedirectResponse:
        query = urlencode({k: v for k, v in (("msg", msg), ("error", error)) if v})
        return RedirectResponse(f"{to}?{query}" if query else to, status_code=303)

    async def names(self, principal: Principal) -> dict[uuid.UUID, str]:
        found: dict[uuid.UUID, str] = {}
        for tenant in principal.tenants:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                for t in await tenancy.list_tenants(conn, limit=2):
                    found[t.id] = t.name
        return found

    # ---- login --------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        nonce = request.cookies.get(Sessions.LOGIN_COOKIE) or secrets.token_hex(16)
        body = (
            '<form method="post" action="/login" id="login">'
            f'<input type="hidden" name="csrf" value="{h(self.sessions.csrf(nonce))}">'
            '<label>Token <input type="password" name="token" id="token" autofocus></label> '
            "<button>Sign in</button></form>"
        )
        response = HTMLResponse(
            layout("Sign in", body, who=None, error=request.query_params.get("error"))
        )
        response.set_cookie(
            Sessions.LOGIN_COOKIE,
            nonce,
            httponly=True,
            samesite="strict",
            secure=self.secure_cookies,
        )
        return response

    async def login(self, request: Request) -> Response:
        form_data = await request.form()
        token, csrf = form_data.get("token"), form_data.get("csrf")
        if not self.sessions.csrf_ok(
            request.cookies.get(Sessions.LOGIN_COOKIE), csrf if isinstance(csrf, str) else None
        ):
            return PlainTextResponse("refused: CSRF token missing or wrong", 403)
        principal = self.sessions.login(token) if isinstance(token, str) else None
        if principal is None:
            return self.back("/login", error="unknown token")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            Sessions.COOKIE,
            self.sessions.cookie_for(principal),
            httponly=True,
            samesite="strict",
            secure=self.secure_cookies,
            max_age=12 * 3600,
        )
        return response

    async def logout(self, request: Request, principal: Principal) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(Sessions.COOKIE)
        return response

    # ---- pages --------------------------------------------------------------------

    async def home(self, request: Request, principal: Principal) -> Response:
        parts = []
        for tenant in principal.tenants:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                found = await tenancy.list_tenants(conn, limit=2)
                if not found:
                    continue
                states = await overview.task_states(conn, tenant)
                act = await overview.activity(conn, tenant, minutes=60)
                books = await overview.budgets(conn, tenant)
                waiting = await overview.approvals(conn, tenant)
                unsettled = await overview.unsettled(conn, tenant)
                dead = await overview.outbox(conn, tenant, state="dead")
            base = f"/t/{tenant}"
            rows = [
                (
                    f'<a href="{base}?state={h(s["state"])}" class="state-{h(s["state"])}">'
                    f"{h(s['state'])}</a>",
                    h(s["n"]),
                    age(s["oldest_s"]),
                )
                for s in states
            ]
            parts.append(
                f'<div class="card tenant" data-tenant="{h(tenant)}"><h2>'
                f'<a href="{base}">{h(found[0].name)}</a> <small>{h(tenant)}</small></h2>'
                f'<a href="/inbox">{len(waiting)} waiting for approval</a> · '
                f'<a href="/effects">{len(unsettled)} unsettled effects</a> · '
                f'<a href="/outbox">{len(dead)} dead messages</a>'
                + table(("state", "tasks", "oldest in it"), rows)
                + "<h3>Last hour</h3>"
                + chart(act)
                + "<h3>Budgets</h3>"
                + ("".join(f"<div>{budget_bar(b)}</div>" for b in books) or "<i>none</i>")
                + "</div>"
            )
        return self.page(request, "Tenants", "".join(parts) or "<p>No tenant to show.</p>")

    async def tenant_tasks(self, request: Request, principal: Principal) -> Response:
        tenant = self.tenant_of(request, principal)
        wanted = request.query_params.get("state") or None
        async with tenancy.tenant_scope(self.pool(), tenant) as conn:
            rows = await overview.task_list(conn, tenant, state=wanted, limit=200)
            name = next(iter(await tenancy.list_tenants(conn, limit=2)), None)
        if name is None:
            raise HTTPException(404, "no such tenant")
        body = table(
            ("task", "type", "state", "age", "attempts", "error"),
            (
                (
                    f'<a href="/t/{tenant}/task/{h(r["id"])}">{h(r["id"])}</a>',
                    h(r["task_type"]),
                    f'<span class="state-{h(r["state"])}">{h(r["state"])}</span>',
                    age(r["age_s"]),
                    f"{r['attempts']}/{r['max_attempts']}",
                    h(r["last_error"]),
                )
                for r in rows
            ),
            id="tasks",
        )
        title = f"{name.name}: {'tasks ' + wanted if wanted else 'tasks'}"
        return self.page(request, title, body)

    async def task_page(self, request: Request, principal: Principal) -> Response:
        tenant = self.tenant_of(request, principal)
        task_id = _uuid(request.path_params["task"])
        async with tenancy.tenant_scope(self.pool(), tenant) as conn:
            try:
                task = await tasks.get(conn, tenant, task_id)
            except NotFound:
                raise HTTPException(404, "no such task") from None
            tl = await overview.timeline(conn, tenant, task_id)
        csrf = self.csrf_of(request)
        base = f"/t/{tenant}/task/{task_id}"
        buttons = ""
        if task.state in ("pending", "waiting", "running"):
            buttons += form(f"{base}/cancel", csrf, "Cancel", _reason(), id="cancel")
        if task.state in tasks.RETRYABLE_STATES:
            buttons += form(f"{base}/retry", csrf, "Retry", _reason(), id="retry")
        head = (
            f'<p>Type <b>{h(task.task_type)}</b>, state <b id="task-state" '
            f'class="state-{h(task.state)}">{h(task.state)}</b>, attempts {task.attempts}/'
            f"{task.max_attempts}, lease {h(task.lease_owner or '-')}"
            f"{', error ' + h(task.last_error) if task.last_error else ''}</p>"
            f"{pretty(task.params)}{buttons}"
        )
        body = head + _timeline_html(tenant, tl)
        return self.page(request, f"Task {task_id}", body)

    async def inbox(self, request: Request, principal: Principal) -> Response:
        csrf = self.csrf_of(request)
        tenant_names = await self.names(principal)
        rows = []
        for tenant in principal.tenants:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                waiting = await overview.approvals(conn, tenant)
            for a in waiting:
                base = f"/t/{tenant}/task/{a['id']}"
                fields = (
                    f'<input type="hidden" name="signal" value="{h(a["wait_signal"])}">'
                    '<input name="comment" placeholder="comment" class="comment">'
                )
                asks = a["asked"] or (
                    {"after": a["last_step"], "which gave": a["last_result"]}
                    if a["last_step"]
                    else None
                )
                rows.append(
                    (
                        h(tenant_names.get(tenant, tenant)),
                        f'<a href="{base}">{h(a["id"])}</a><br>{h(a["task_type"])}',
                        h(a["wait_signal"]) + (f"<br>step {h(a['step'])}" if a["step"] else ""),
                        pretty(a["params"]) + pretty(asks),
                        age(a["waiting_s"]),
                        h(", ".join(a["lease_holders"] or [])),
                        form(f"{base}/decide/approve", csrf, "Approve", fields)
                        + form(f"{base}/decide/reject", csrf, "Reject", fields),
                    )
                )
        body = table(
            ("tenant", "task", "waits for", "what it wants to do", "waiting", "held by", ""),
            rows,
            id="approvals",
        )
        return self.page(request, "Approvals waiting", body)

    async def effects(self, request: Request, principal: Principal) -> Response:
        csrf = self.csrf_of(request)
        tenant_names = await self.names(principal)
        rows = []
        for tenant in principal.tenants:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                found = await overview.unsettled(conn, tenant)
            for o in found:
                base = f"/t/{tenant}/effect/{o['id']}"
                reconcile = form(
                    f"{base}/reconcile",
                    csrf,
                    "Reconcile",
                    '<input name="reference" placeholder="provider reference" class="reference">'
                    '<select name="outcome"><option value="succeeded">it happened</option>'
                    '<option value="failed">it did not</option></select>',
                )
                fail = form(
                    f"{base}/fail",
                    csrf,
                    "Fail",
                    '<input name="error" placeholder="why" class="why">',
                )
                rows.append(
                    (
                        h(tenant_names.get(tenant, tenant)),
                        f'<span class="op">{h(o["id"])}</span>',
                        h(o["action"]),
                        h(o["state"]),
                        f'<a href="/t/{tenant}/task/{h(o["task_id"])}">{h(o["task_id"])}</a>',
                        age(o["age_s"]),
                        h(o["error"]),
                        reconcile + fail,
                    )
                )
        body = table(
            ("tenant", "operation", "action", "state", "task", "since", "error", ""),
            rows,
            id="unsettled",
        )
        return self.page(request, "Unsettled effects", body)

    async def dead(self, request: Request, principal: Principal) -> Response:
        csrf = self.csrf_of(request)
        tenant_names = await self.names(principal)
        rows = []
        for tenant in principal.tenants:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                found = await overview.outbox(conn, tenant, state="dead")
            for m in found:
                rows.append(
                    (
                        h(tenant_names.get(tenant, tenant)),
                        f'<span class="msg">{h(m["id"])}</span>',
                        h(m["topic"]),
                        h(m["attempts"]),
                        h(m["last_error"]),
                        form(f"/t/{tenant}/outbox/{m['id']}/retry", csrf, "Retry"),
                    )
                )
        body = table(("tenant", "message", "topic", "attempts", "error", ""), rows, id="dead")
        return self.page(request, "Dead messages", body)

    async def live(self, request: Request, principal: Principal) -> Response:
        async def stream() -> AsyncIterator[str]:
            while not await request.is_disconnected():
                yield f"data: {await _fingerprint(self.pool(), principal)}\n\n"
                await asyncio.sleep(self.live_interval)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    # ---- actions ------------------------------------------------------------------

    async def act(
        self,
        request: Request,
        principal: Principal,
        to: str,
        done: str,
        action: Callable[[_db.Conn, uuid.UUID, Any], Awaitable[object]],
    ) -> Response:
        tenant = self.tenant_of(request, principal)
        form_data = await request.form()
        try:
            async with tenancy.tenant_scope(self.pool(), tenant) as conn:
                await action(conn, tenant, form_data)
        except NotFound:
            raise HTTPException(404, "not found") from None
        except AgentDBError as exc:
            return self.back(to, error=f"refused: {exc}")
        except Exception as exc:
            refused = database_refusal(exc)
            if refused is None:
                raise
            return self.back(to, error=f"refused: {refused}")
        return self.back(to, msg=done)

    async def task_cancel(self, request: Request, principal: Principal) -> Response:
        task_id = _uuid(request.path_params["task"])

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            reason = _text(f, "reason")
            return await tasks.cancel(conn, tenant, task_id, reason=reason, actor=principal.name)

        to = f"/t/{request.path_params['tenant']}/task/{task_id}"
        return await self.act(request, principal, to, "cancelled", action)

    async def task_retry(self, request: Request, principal: Principal) -> Response:
        task_id = _uuid(request.path_params["task"])

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            reason = _text(f, "reason")
            return await tasks.retry(conn, tenant, task_id, actor=principal.name, reason=reason)

        to = f"/t/{request.path_params['tenant']}/task/{task_id}"
        return await self.act(request, principal, to, "back to pending", action)

    async def decide(self, request: Request, principal: Principal) -> Response:
        task_id = _uuid(request.path_params["task"])
        decision = _DECISIONS.get(request.path_params["decision"])
        if decision is None:
            raise HTTPException(404, "no such decision")

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            return await signals.approve(
                conn,
                tenant,
                task_id,
                approver=principal.name,
                decision=decision,
                comment=_text(f, "comment"),
                name=_text(f, "signal") or "approval",
            )

        return await self.act(request, principal, "/inbox", f"{decision}: task {task_id}", action)

    async def reconcile(self, request: Request, principal: Principal) -> Response:
        op_id = _uuid(request.path_params["op"])

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            reference = _text(f, "reference")
            if not reference:
                raise ConfigurationError("say the provider's reference for the effect")
            op = await operations.get(conn, tenant, op_id)
            return await operations.reconcile(
                conn,
                op,
                succeeded=_text(f, "outcome") != "failed",
                provider_reference=reference,
                actor=principal.name,
            )

        return await self.act(request, principal, "/effects", f"reconciled {op_id}", action)

    async def fail_effect(self, request: Request, principal: Principal) -> Response:
        op_id = _uuid(request.path_params["op"])

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            op = await operations.get(conn, tenant, op_id)
            error = _text(f, "error") or f"failed by {principal.name}"
            return await operations.fail(conn, op, error, actor=principal.name)

        return await self.act(request, principal, "/effects", f"failed {op_id}", action)

    async def outbox_retry(self, request: Request, principal: Principal) -> Response:
        message_id = _uuid(request.path_params["message"])

        async def action(conn: _db.Conn, tenant: uuid.UUID, f: Any) -> object:
            return await outbox.retry(conn, tenant, message_id, actor=principal.name)

        return await self.act(request, principal, "/outbox", f"retried {message_id}", action)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, HTTPException) else "not found"
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if self.who(request) is None:
            return PlainTextResponse(detail, status_code=status)
        return self.page(request, "Not here", f"<p>{h(detail)}</p>", status)

    def app(self) -> Starlette:
        """The ASGI app."""
        routes = [
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.signed_in(self.logout), methods=["POST"]),
            Route("/", self.signed_in(self.home)),
            Route("/inbox", self.signed_in(self.inbox)),
            Route("/effects", self.signed_in(self.effects)),
            Route("/outbox", self.signed_in(self.dead)),
            Route("/live", self.signed_in(self.live)),
            Route("/t/{tenant}", self.signed_in(self.tenant_tasks)),
            Route("/t/{tenant}/task/{task}", self.signed_in(self.task_page)),
            Route(
                "/t/{tenant}/task/{task}/cancel", self.signed_in(self.task_cancel), methods=["POST"]
            ),
            Route(
                "/t/{tenant}/task/{task}/retry", self.signed_in(self.task_retry), methods=["POST"]
            ),
            Route(
                "/t/{tenant}/task/{task}/decide/{decision}",
                self.signed_in(self.decide),
                methods=["POST"],
            ),
            Route(
                "/t/{tenant}/effect/{op}/reconcile",
                self.signed_in(self.reconcile),
                methods=["POST"],
            ),
            Route(
                "/t/{tenant}/effect/{op}/fail", self.signed_in(self.fail_effect), methods=["POST"]
            ),
            Route(
                "/t/{tenant}/outbox/{message}/retry",
                self.signed_in(self.outbox_retry),
                methods=["POST"],
            ),
        ]
        return Starlette(
            routes=routes,
            lifespan=self.lifespan,
            exception_handlers={HTTPException: self.not_found},
        )


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise HTTPException(404, "not found") from None


def _text(form_data: Any, key: str) -> str | None:
    value = form_data.get(key)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:1000]


def _reason() -> str:
    return '<input name="reason" placeholder="reason">'


def _timeline_html(tenant: uuid.UUID, tl: overview.Timeline) -> str:
    events = table(
        ("when", "event", "move", "by", "payload"),
        (
            (
                h(e["created_at"]),
                h(e["event_type"]),
                h(f"{e['from_state'] or '-'} -> {e['to_state']}") if e["to_state"] else "",
                h(e["actor_id"]),
                pretty(e["payload"]),
            )
            for e in tl.events
        ),
        id="events",
    )
    steps = table(
        ("step", "kind", "state", "result", "recorded"),
        (
            (h(s["name"]), h(s["kind"]), h(s["state"]), pretty(s["result"]), h(s["updated_at"]))
            for s in tl.steps
        ),
        id="steps",
    )
    effects = table(
        ("key", "action", "outcome", "provider reference", "result / error", "attempts"),
        (
            (
                h(o["idempotency_key"]),
                h(o["action"]),
                h(o["state"]),
                h(o["provider_reference"]),
                pretty(o["result"]) + h(o["error"]),
                h(o["attempts"]),
            )
            for o in tl.effects
        ),
        id="effects",
    )
    sigs = table(
        ("#", "signal", "kind", "decision", "from", "payload"),
        (
            (
                h(s["seq"]),
                h(s["name"]),
                h(s["kind"]),
                h(s["decision"]),
                h(s["sender"]),
                pretty(s["payload"]),
            )
            for s in tl.signals
        ),
        id="signals",
    )
    kids = table(
        ("child", "key", "type", "state", "result"),
        (
            (
                f'<a href="/t/{tenant}/task/{h(c["id"])}">{h(c["id"])}</a>',
                h(c["key"]),
                h(c["task_type"]),
                h(c["state"]),
                pretty(c["result"]),
            )
            for c in tl.children
        ),
        id="children",
    )
    messages = table(
        ("message", "topic", "state", "attempts", "delivered", "error"),
        (
            (
                f'<span class="msg">{h(m["id"])}</span>',
                h(m["topic"]),
                f'<span class="msg-state">{h(m["state"])}</span>',
                f"{m['attempts']}/{m['max_attempts']}",
                h(m["delivered_at"]),
                h(m["last_error"]),
            )
            for m in tl.messages
        ),
        id="messages",
    )
    return (
        f"<h2>Events</h2>{events}<h2>Steps</h2>{steps}<h2>Effects</h2>{effects}"
        f"<h2>Signals</h2>{sigs}<h2>Children</h2>{kids}<h2>Messages</h2>{messages}"
    )


async def _fingerprint(pool: _db.Pool, principal: Principal) -> str:
    """What the pages show, hashed: it changes when a task moves, an approval arrives or
    goes, an effect is settled or a message dies or is retried."""
    seen: list[Any] = []
    for tenant in principal.tenants:
        async with tenancy.tenant_scope(pool, tenant) as conn:
            seen.append(await overview.task_states(conn, tenant))
            seen.append([a["id"] for a in await overview.approvals(conn, tenant)])
            seen.append([o["id"] for o in await overview.unsettled(conn, tenant)])
            seen.append([m["id"] for m in await overview.outbox(conn, tenant, state="dead")])
            latest = await overview.task_list(conn, tenant, limit=1)
            seen.append([(r["id"], r["updated_at"]) for r in latest])
    # oldest_s grows every second; what changed is the counts, not the ages.
    for states in seen[0::5]:
        for s in states:
            s.pop("oldest_s", None)
    return hashlib.sha256(json.dumps(seen, sort_keys=True, default=str).encode()).hexdigest()[:16]
