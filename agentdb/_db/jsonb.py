"""JSON documents bound for jsonb columns, checked against their caps before sending."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agentdb.errors import ConfigurationError, PayloadTooLarge

__all__ = ["EVENT_PAYLOAD_CAP", "OBJECT_CAP", "TEXT_CAP", "document", "value"]

_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")

#: agent_events_payload_size (G9).
EVENT_PAYLOAD_CAP = 8192
#: agent_tasks_params_valid, agent_operations_result_valid, agent_outbox_payload_size.
OBJECT_CAP = 65536
#: Error texts: agent_tasks_last_error_valid, agent_operations_error_valid,
#: agent_outbox_last_error_valid (length in characters).
TEXT_CAP = 4000


def _key_not_text(value: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> object:
    """The first object key under ``value`` that is not a string, else ``_TEXT``."""
    pending: list[Any] = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return key
                if isinstance(item, dict | list | tuple):
                    pending.append(item)
        else:
            pending.extend(i for i in node if isinstance(i, dict | list | tuple))
    return _TEXT


_TEXT = object()


def document(value: Mapping[str, Any] | None, *, cap: int, what: str) -> str | None:
    """Encode ``value`` as JSON text for a jsonb parameter.

    Raises:
        PayloadTooLarge: the encoding is over ``cap`` bytes.
        ConfigurationError: ``value`` is not a mapping, not JSON-serialisable, or
            has an object key that is not a string.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{what} must be a JSON object (a mapping), not {type(value).__name__}"
        )
    # json.dumps would write the key 1 as "1" (None as "null"): stored under
    # another name, and {1: "a", "1": "b"} would lose "a" in jsonb.
    return _encode(value, cap=cap, what=what)


def value(value: Any, *, cap: int, what: str) -> str | None:
    """Encode any JSON value (an object, an array, a string, a number, a boolean) for a jsonb
    parameter, as :func:`document` does an object; ``None`` is SQL NULL.

    Raises:
        as :func:`document`.
    """
    if value is None:
        return None
    return _encode(value, cap=cap, what=what)


def _encode(value: Any, *, cap: int, what: str) -> str:
    key = _key_not_text(value) if isinstance(value, dict | list | tuple) else _TEXT
    if key is not _TEXT:
        raise ConfigurationError(
            f"{what} has an object key that is not a string: {key!r} ({type(key).__name__})"
        )
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode("utf-8"))  # a lone surrogate survives json.dumps, not the wire
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{what} is not JSON-serialisable: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"{what} is nested too deeply to store") from None
    if "\\u0000" in text and _NUL.search(text):
        # json.dumps writes a NUL as \u0000 (an escaped backslash before "u0000" is
        # not one); jsonb refuses it (22P05).
        raise ConfigurationError(f"{what} contains a NUL character, which jsonb cannot store")
    # The CHECKs measure jsonb's own rendering, which puts a space after every
    # ',' and ':' between items; measure the same way. The CHECK stays the
    # final guard. That rendering is at most the compact text plus one byte
    # per ',' and ':' in it (those inside strings get none): a document under
    # the cap by that bound is not encoded a second time.
    if size + text.count(",") + text.count(":") <= cap:
        return text
    rendered = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
    size = len(rendered.encode("utf-8"))
    if size > cap:
        raise PayloadTooLarge(f"{what} is {size} bytes; the cap is {cap}")
    return text
