"""``agentdb console``: serve the operator's console (Starlette, uvicorn) on a loopback port.

It signs principals in by their token (``--principals FILE`` or
``$AGENTDB_CONSOLE_PRINCIPALS``; there is no open mode, on any address) and
connects as a login that is a member of ``agentdb_operator`` - never the
owner, a superuser or a role that bypasses row-level security: the database,
not the console's own checks, is what keeps a principal to its tenants.
A non-loopback ``--host`` is refused unless ``--public`` says it is meant
(then put TLS in front: ``--secure-cookies`` marks the cookies Secure).
"""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from agentdb import _db
from agentdb import schema as agentdb_schema
from agentdb.errors import ConfigurationError
from agentdb.tools._common import add_target, dsn_from
from agentdb.tools._signals import run_async

__all__ = ["add_console", "check_role"]

# The console's login, checked before it serves anything.
_ROLE_SQL = """
SELECT r.rolsuper, r.rolbypassrls,
       pg_has_role(current_user, 'agentdb_operator', 'MEMBER') AS operator,
       pg_has_role(current_user, c.relowner, 'MEMBER') AS owner
FROM pg_roles r, pg_class c
WHERE r.rolname = current_user AND c.oid = 'agent_tasks'::regclass
"""


def add_console(sub: Any) -> None:
    p = sub.add_parser(
        "console",
        help="serve the operator's web console (approvals, timelines, effects, dead messages)",
    )
    add_target(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument(
        "--principals",
        help="JSON file of principals: name, token (or token_sha256), tenant ids"
        " (default: $AGENTDB_CONSOLE_PRINCIPALS)",
    )
    p.add_argument(
        "--public", action="store_true", help="allow a --host that is not a loopback address"
    )
    p.add_argument(
        "--secure-cookies", action="store_true", help="mark cookies Secure (behind HTTPS)"
    )
    p.set_defaults(func=_serve)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def check_role(pool: _db.Pool) -> None:
    """Refuse a login the database would not hold to its tenants.

    Raises:
        ConfigurationError: the login is a superuser, bypasses RLS, owns the
            schema, or is not a member of ``agentdb_operator``.
    """
    row = await pool.fetchrow(_ROLE_SQL)
    if row is None:
        raise ConfigurationError("the console's login has no role row")
    if row["rolsuper"] or row["rolbypassrls"] or row["owner"]:
        raise ConfigurationError(
            "the console must not connect as the owner, a superuser or a role that bypasses"
            " row-level security: give it a login IN ROLE agentdb_operator"
        )
    if not row["operator"]:
        raise ConfigurationError(
            "the console's login is not a member of agentdb_operator"
            " (CREATE ROLE console LOGIN PASSWORD '...' IN ROLE agentdb_operator)"
        )


def _serve(args: argparse.Namespace) -> int:
    from agentdb.tools.console.auth import load_principals

    dsn = dsn_from(args)
    if not _loopback(args.host) and not args.public:
        raise ConfigurationError(
            f"--host {args.host} is not a loopback address; say --public if it is meant"
        )
    if not 1 <= args.port <= 65535:
        raise ConfigurationError("--port must be 1 to 65535")
    principals = load_principals(args.principals)

    async def probe() -> None:  # one line and a non-zero exit before serving anything
        pool = await _db.create_pool(dsn, min_size=1, max_size=1, schema=args.schema)
        try:
            await agentdb_schema.check(pool)
            await check_role(pool)
        finally:
            await pool.close()

    run_async(probe)
    return serve(dsn, principals, args.host, args.port, args.schema, args.secure_cookies)


def serve(
    dsn: str,
    principals: list[Any],
    host: str,
    port: int,
    schema: str | None = None,
    secure_cookies: bool = False,
) -> int:
    """Serve the console until interrupted.

    Raises:
        ConfigurationError: the console extra is not installed.
    """
    try:
        import uvicorn

        from agentdb.tools.console.app import build_app
    except ImportError as exc:
        raise ConfigurationError(
            "the console needs its extra: pip install 'agentdb-pg[console]'"
            f" ({exc.name} is missing)"
        ) from None

    async def pool() -> _db.Pool:
        return await _db.create_pool(dsn, min_size=1, max_size=4, schema=schema)

    app = build_app(pool, principals, secure_cookies=secure_cookies)
    print(f"agentdb console on http://{host}:{port}/ ({len(principals)} principals)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
    return 0
