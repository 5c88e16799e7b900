"""Redaction of audit-event payloads before they are written (G9).

Audit events carry redacted facts or references, never secrets, full prompts
or unbounded provider responses. :func:`redact` walks a payload of any
depth and:

* replaces the value of every key that names a secret (``password``,
  ``api_key``, ``authorization``, ``access_token``, ...) with ``"[redacted]"``;
* masks every secret-looking substring inside strings (provider API keys,
  bearer tokens, JWTs, PEM private keys, AWS access keys, GitHub and Slack
  tokens) with ``"[redacted]"``, and renames keys that look like secrets;
* replaces every string longer than ``max_value_bytes`` (a prompt, a response
  body) with a reference ``{"$ref": "sha256:<hex>", "bytes": <n>}``.

The patterns are a superset of what the database's CHECK
``agent_events_payload_no_secrets`` refuses, so a redacted payload is never
refused for secrets; the CHECK stays the final guard for writers that skip
this module. What is left must fit the 8 KiB cap (``PayloadTooLarge``).

Most value patterns need a word boundary on their left (``sk-`` inside
``task-…`` is no key), so a token written straight after letters or digits,
with no separator (``…abcsk-proj-…``), is found by neither the redactor nor
the CHECK; a secret straight after a masked one is found (masking repeats).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentdb.errors import ConfigurationError

__all__ = ["DEFAULT", "MASK", "Redactor", "configure", "mask", "redact"]

MASK = "[redacted]"
_PASSES = 64

_SECRET_KEY = (
    r"passw|secret|api[_-]?key|apikey|authori[sz]ation|bearer|private[_-]?key|"
    r"(access|refresh|id|auth|session)[_-]?token|cookie|credential|signature"
)
_SECRET_VALUES = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}",
    r"(?<![A-Za-z0-9])(sk|rk|pk)-[A-Za-z0-9_-]{16,}",
    r"(?<![A-Za-z0-9])AKIA[0-9A-Z]{16}",
    r"(?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{30,}",
    r"(?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}",
    r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
)


@dataclass(frozen=True)
class Redactor:
    """Which keys and values count as secrets, and how long a value may be.

    Extend the defaults with ``extra_keys`` (a regex alternation, matched
    case-insensitively anywhere in the key) and ``extra_patterns`` (regexes
    matched anywhere in string values).
    """

    extra_keys: str = ""
    extra_patterns: tuple[str, ...] = ()
    max_value_bytes: int = 512
    _key: re.Pattern[str] = field(init=False, repr=False)
    _values: re.Pattern[str] = field(init=False, repr=False)
    _each: tuple[re.Pattern[str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        keys = _SECRET_KEY + (f"|{self.extra_keys}" if self.extra_keys else "")
        values = "|".join(f"(?:{p})" for p in (*_SECRET_VALUES, *self.extra_patterns))
        object.__setattr__(self, "_key", re.compile(keys, re.IGNORECASE))
        object.__setattr__(self, "_values", re.compile(values))
        each = tuple(re.compile(p) for p in (*_SECRET_VALUES, *self.extra_patterns))
        object.__setattr__(self, "_each", each)

    def _mask(self, value: str) -> str:
        """``value`` with every stretch any one pattern matches replaced by the mask.

        Each pattern is matched on its own and the stretches merged: the
        alternation alone takes the first match at a position and moves on, so
        a key that runs into a "Bearer <token>" would swallow the word and leave
        the token behind.
        """
        if self._values.search(value) is None:
            return value
        spans = sorted(m.span() for p in self._each for m in p.finditer(value))
        out: list[str] = []
        done = 0
        start, end = spans[0]
        for s, e in spans[1:]:
            if s <= end:
                end = max(end, e)
                continue
            out += (value[done:start], MASK)
            done, start, end = end, s, e
        out += (value[done:start], MASK, value[end:])
        return "".join(out)

    def _string(self, value: str, refs: bool = True) -> Any:
        masked = self._mask(value)
        # A secret glued to the one before it hid behind that one's lookbehind;
        # once the first is masked it follows "]", where the database's check
        # finds it. Mask again until nothing changes (a bound: a pattern of the
        # caller's could match the mask itself).
        for _ in range(_PASSES):
            again = self._mask(masked)
            if again == masked:
                break
            masked = again
        size = len(masked.encode("utf-8"))
        if refs and size > self.max_value_bytes:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
            return {"$ref": f"sha256:{digest}", "bytes": len(value.encode("utf-8"))}
        return masked

    def _walk(self, value: Any, refs: bool = True) -> Any:
        if isinstance(value, str):
            return self._string(value, refs)
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for i, (key, item) in enumerate(value.items()):
                if not isinstance(key, str):
                    # str(key) would make None "None" where the params' encoding
                    # writes "null"; a key is text or the payload is refused.
                    raise ConfigurationError(
                        f"the event payload has an object key that is not a string: {key!r}"
                    )
                name = key
                if self._values.search(name):
                    name = f"[redacted key {i}]"
                out[name] = MASK if self._key.search(name) else self._walk(item, refs)
            return out
        if isinstance(value, list | tuple):
            return [self._walk(v, refs) for v in value]
        return value

    def redact(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Return a redacted copy of ``payload`` (the input is not modified).

        Raises:
            ConfigurationError: ``payload`` is nested too deeply to walk, holds a string
                that is not valid Unicode (a lone surrogate), or an object key that is
                not a string.
        """
        try:
            result: dict[str, Any] = self._walk(payload)
        except RecursionError:
            raise ConfigurationError("the event payload is nested too deeply") from None
        except UnicodeEncodeError as exc:
            raise ConfigurationError(f"the event payload is not valid Unicode: {exc}") from None
        return result

    def mask(self, value: Any) -> Any:
        """A copy of ``value`` (any JSON) with its secrets masked - keys that name one, values
        that look like one - and nothing else changed: no string is replaced by a reference,
        however long. For what must be read back as it was (a step's result, G25).

        Raises:
            ConfigurationError: as :meth:`redact`.
        """
        try:
            return self._walk(value, refs=False)
        except RecursionError:
            raise ConfigurationError("the value is nested too deeply") from None
        except UnicodeEncodeError as exc:
            raise ConfigurationError(f"the value is not valid Unicode: {exc}") from None


DEFAULT = Redactor()
_current = DEFAULT


def configure(redactor: Redactor) -> None:
    """Use ``redactor`` for every event payload this process writes from now on."""
    global _current
    _current = redactor


def redact(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Redact ``payload`` with the configured :class:`Redactor`."""
    return _current.redact(payload)


def mask(value: Any) -> Any:
    """Mask the secrets in ``value`` with the configured redactor (:meth:`Redactor.mask`)."""
    return _current.mask(value)
