"""``agentdb demo --console``: after the report, leave the operator's console up on the demo's
database, with invoices waiting for a human's approval.

A tenant of its own (``demo-console``) gets a few invoices above the review
threshold and one worker and one relay without faults; nobody plays the
reviewer this time, so they wait - for you. The console logs in as a role
made for it (``IN ROLE agentdb_operator``, never the owner), and the page
prints the one-time token of principal ``you@demo``. Ctrl-C ends it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from agentdb import _db, tasks, tenancy
from agentdb.tools._signals import run_async
from agentdb.tools.demo.fleet import PUBLISHER_TARGET, WORKER_TARGET, spawn_cli
from agentdb.tools.demo.provider import REVIEW_ABOVE, TASK_TYPE

__all__ = ["CONSOLE_ROLE", "serve_console"]

CONSOLE_ROLE = "agentdb_demo_console"
PRINCIPAL = "you@demo"
INVOICES = 3


def _as_role(dsn: str, role: str, password: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}"))


async def _prepare(dsn: str, password: str) -> uuid.UUID:
    pool = await _db.create_pool(dsn, min_size=1, max_size=2)
    try:
        # The role's name and password are ours (a constant, token_hex): no quoting to get wrong.
        exists = await pool.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", CONSOLE_ROLE)
        verb = "ALTER" if exists else "CREATE"
        await pool.execute(f"{verb} ROLE {CONSOLE_ROLE} LOGIN PASSWORD '{password}'")
        await pool.execute(f"GRANT agentdb_operator TO {CONSOLE_ROLE}")
        tenant = await tenancy.create_tenant(pool, "demo-console")
        for n in range(INVOICES):
            await tasks.create(
                pool, tenant, TASK_TYPE,
                params={"invoice": 10_000 + n, "amount": REVIEW_ABOVE + 50 * (n + 1), "lines": []},
                dedupe_key=f"console-invoice-{uuid.uuid4().hex[:8]}",
            )  # fmt: skip
        return tenant
    finally:
        await pool.close()


def serve_console(dsn: str, log: IO[bytes], *, port: int = 8765) -> int:
    """Serve the console on the demo's database until Ctrl-C; return 0."""
    from agentdb.tools.console.auth import load_principals
    from agentdb.tools.console.command import serve

    password = secrets.token_hex(16)
    tenant = run_async(lambda: _prepare(dsn, password))
    token = secrets.token_urlsafe(18)
    folder = Path(tempfile.mkdtemp(prefix="agentdb-console-"))
    path = folder / "principals.json"
    path.write_text(
        json.dumps({"principals": [{"name": PRINCIPAL, "token": token, "tenants": [str(tenant)]}]}),
        encoding="utf-8",
    )
    os.chmod(path, 0o600)
    env = dict(os.environ, DATABASE_URL=dsn)
    common = ["--dsn", dsn, "--log-level", "warning"]
    fleet: list[subprocess.Popen[bytes]] = [
        spawn_cli(["worker", WORKER_TARGET, "--poll-interval", "0.2", *common], env, log),
        spawn_cli(["relay", PUBLISHER_TARGET, "--poll-interval", "0.2", *common], env, log),
    ]
    print(
        f"\nthe console: http://127.0.0.1:{port}/  sign in with the token {token}\n"
        f"{INVOICES} invoices of tenant demo-console wait for your approval (Approvals);"
        " Ctrl-C to stop",
        flush=True,
    )
    try:
        return serve(_as_role(dsn, CONSOLE_ROLE, password), load_principals(str(path)),
                     "127.0.0.1", port)  # fmt: skip
    finally:
        for proc in fleet:
            proc.terminate()
        for proc in fleet:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        path.unlink(missing_ok=True)
        folder.rmdir()
