"""Canonical input hashing for idempotency keys (G4).

``input_hash(value)`` is the lowercase hex SHA-256 of ``canonical_json(value)``,
a JSON text that is the same for inputs that mean the same thing:

* objects: keys sorted by code point after Unicode NFC normalisation; no
  whitespace anywhere (separators ``,`` and ``:``);
* strings (keys and values): NFC-normalised, then JSON-escaped as
  ``json.dumps(..., ensure_ascii=False)`` does;
* numbers: ``int``, ``float`` and ``Decimal`` are one kind. The value is
  written as its shortest exact decimal coefficient and, if not zero, an
  exponent: ``1``, ``1.0`` and ``Decimal("1.00")`` are ``1``; ``1.5`` is
  ``15e-1``; ``100`` is ``1e2``; ``-0.0`` is ``0``. Floats use their shortest
  round-trip repr, so ``0.1`` is ``1e-1``;
* ``true``, ``false``, ``null``; lists and tuples keep their order.

Anything else (NaN, infinities, bytes, datetimes, sets, non-string keys, two
keys equal after normalisation) is refused with ``ConfigurationError``:
convert it to one of the types above yourself, so the hash never depends on
a conversion agentdb guessed.
"""

from __future__ import annotations

import hashlib
import unicodedata
from decimal import Decimal
from json.encoder import encode_basestring

from agentdb.errors import ConfigurationError

__all__ = ["canonical_json", "input_hash"]


def _number(value: int | float | Decimal) -> str:
    d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not d.is_finite():
        raise ConfigurationError(f"cannot hash a non-finite number: {value!r}")
    if d.is_zero():
        return "0"
    # The trailing zeros are moved into the exponent by hand: Decimal.normalize()
    # rounds to the context's 28 digits, and two numbers that differ beyond them
    # would hash alike (G4: another request's stored result handed back).
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    coefficient = "".join(map(str, digits))
    significant = coefficient.rstrip("0")
    exponent += len(coefficient) - len(significant)
    text = ("-" if sign else "") + significant
    return text if exponent == 0 else f"{text}e{exponent}"


def _string(value: str) -> str:
    # What json.dumps(value, ensure_ascii=False) returns, without making an encoder per call.
    return encode_basestring(unicodedata.normalize("NFC", value))


def _encode(value: object, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int | float | Decimal):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, dict):
        normalised: dict[str, object] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigurationError(f"cannot hash an object key of type {type(key).__name__}")
            nkey = unicodedata.normalize("NFC", key)
            if nkey in normalised:
                raise ConfigurationError(f"two keys are equal after NFC normalisation: {nkey!r}")
            normalised[nkey] = item
        out.append("{")
        for i, key in enumerate(sorted(normalised)):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _encode(normalised[key], out)
        out.append("}")
    else:
        raise ConfigurationError(
            f"cannot hash a value of type {type(value).__name__}: use JSON types "
            "(dict, list, str, int, float, Decimal, bool, None)"
        )


def canonical_json(value: object) -> bytes:
    """Return the canonical UTF-8 JSON encoding of ``value`` (see the module docstring).

    Raises:
        ConfigurationError: ``value`` holds something that is not plain JSON data.
    """
    out: list[str] = []
    try:
        _encode(value, out)
        return "".join(out).encode("utf-8")
    except RecursionError:
        raise ConfigurationError("cannot hash a value nested this deeply") from None
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"cannot hash a string that is not valid Unicode: {exc}") from None


def input_hash(value: object) -> str:
    """Return the lowercase hex SHA-256 of ``canonical_json(value)``.

    Raises:
        ConfigurationError: as for :func:`canonical_json`.
    """
    return hashlib.sha256(canonical_json(value)).hexdigest()
