"""Who may use the console: principals with a token each, signed session cookies, CSRF tokens.

A principal is a name (what the audit trail records as the actor), a token
(or its SHA-256, so the file need not hold the secret itself) and the
tenants it may see, by id. They come from a JSON file (``--principals`` or
``$AGENTDB_CONSOLE_PRINCIPALS``)::

    {"principals": [
        {"name": "alice@acme", "token_sha256": "…", "tenants": ["…acme's id…"]},
        {"name": "bob@globex", "token": "…", "tenants": ["…globex's id…"]}
    ]}

The session cookie names the principal, expires, and is signed with a key
made at start-up (a restart logs everybody out); it is ``HttpOnly`` and
``SameSite=Strict``. Every POST carries a CSRF token bound to the session
(the login form's to a cookie of its own): a forged form from another site
has neither.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from agentdb.errors import ConfigurationError

__all__ = ["ENV", "Principal", "Sessions", "load_principals"]

#: Where the principals file is named when ``--principals`` is not given.
ENV = "AGENTDB_CONSOLE_PRINCIPALS"
SESSION_TTL = 12 * 3600


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    token_sha256: str
    tenants: tuple[uuid.UUID, ...]

    def may_see(self, tenant: uuid.UUID) -> bool:
        return tenant in self.tenants


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_principals(path: str | None) -> list[Principal]:
    """The principals of the JSON file at ``path`` (else ``$AGENTDB_CONSOLE_PRINCIPALS``).

    Raises:
        ConfigurationError: no file named, unreadable, not the format above,
            a name twice, a token shared, or a tenant that is not an id.
    """
    path = path or os.environ.get(ENV)
    if not path:
        raise ConfigurationError(
            f"the console needs its principals: --principals FILE or ${ENV} (see --help)"
        )
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read principals file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigurationError(f"principals file {path} is not JSON: {exc}") from None
    entries = data.get("principals") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigurationError(f'principals file {path}: expected {{"principals": [...]}}')
    found: list[Principal] = []
    for n, entry in enumerate(entries, start=1):
        found.append(_principal(entry, f"principals file {path}, entry {n}"))
    if len({p.name for p in found}) != len(found):
        raise ConfigurationError(f"principals file {path}: a name appears twice")
    if len({p.token_sha256 for p in found}) != len(found):
        raise ConfigurationError(f"principals file {path}: two principals share a token")
    return found


def _principal(entry: object, where: str) -> Principal:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ConfigurationError(f"{where}: name must be 1 to 200 characters")
    token, digest = entry.get("token"), entry.get("token_sha256")
    if isinstance(token, str) and len(token) >= 16:
        digest = _sha256(token)
    elif not (isinstance(digest, str) and len(digest) == 64):
        raise ConfigurationError(
            f"{where}: give a token of at least 16 characters, or its token_sha256"
        )
    tenants = entry.get("tenants")
    if not isinstance(tenants, list) or not tenants:
        raise ConfigurationError(f"{where}: tenants must be a list of tenant ids")
    try:
        ids = tuple(uuid.UUID(str(t)) for t in tenants)
    except ValueError:
        raise ConfigurationError(f"{where}: tenants must be ids (UUIDs), not names") from None
    return Principal(name, digest.lower(), ids)


class Sessions:
    """Signed session cookies and the CSRF tokens bound to them."""

    COOKIE = "agentdb_console"
    LOGIN_COOKIE = "agentdb_console_login"

    def __init__(self, principals: list[Principal], key: bytes | None = None) -> None:
        self._by_digest = {p.token_sha256: p for p in principals}
        self._by_name = {p.name: p for p in principals}
        self._key = key or secrets.token_bytes(32)

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def login(self, token: str) -> Principal | None:
        """The principal whose token this is (compared in constant time), else ``None``."""
        digest = _sha256(token)
        for known, principal in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return principal
        return None

    def cookie_for(self, principal: Principal) -> str:
        name = base64.urlsafe_b64encode(principal.name.encode()).decode()
        body = f"{name}.{int(time.time()) + SESSION_TTL}.{secrets.token_hex(8)}"
        return f"{body}.{self._sign(body)}"

    def principal(self, cookie: str | None) -> Principal | None:
        """The principal a session cookie names, if it is signed by us and not expired."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(self._sign(body), mac):
            return None
        name_b64, expires, _nonce = body.split(".")
        if not expires.isdigit() or int(expires) < time.time():
            return None
        try:
            name = base64.urlsafe_b64decode(name_b64.encode()).decode()
        except ValueError:
            return None
        return self._by_name.get(name)

    def csrf(self, cookie: str) -> str:
        """The CSRF token of the session (or login form) ``cookie``."""
        return self._sign(f"csrf|{cookie}")[:40]

    def csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        return bool(cookie and token) and hmac.compare_digest(self.csrf(cookie or ""), token or "")
