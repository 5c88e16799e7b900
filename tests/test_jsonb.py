"""What agentdb/_db/jsonb.py sends for a jsonb parameter, and what it refuses before sending.

The database's CHECKs stay the final guard (tests/test_attacks.py); these are the
client's checks, which refuse in Python with a message that names the value, and
the exact text the runtime writes (compact, non-ASCII kept as it is).
Each test names the mutmut mutants it kills (make mutate-python
MODULES=agentdb/_db/jsonb.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentdb._db.jsonb import document, value
from agentdb.errors import ConfigurationError, PayloadTooLarge


def test_the_text_sent_is_compact_json_with_its_characters_as_they_are() -> None:
    """Kills _encode mutants 10, 11, 14, 15 and 17 (ASCII escapes, spaced separators)."""
    assert value({"a": [1, "é", None, True]}, cap=100, what="x") == '{"a":[1,"é",null,true]}'
    assert value("naïve", cap=100, what="x") == '"naïve"'
    assert value(5, cap=100, what="x") == "5"  # _encode mutant 3: a scalar walked as a container
    assert value(None, cap=100, what="x") is None
    assert document(None, cap=100, what="x") is None
    # document mutants 5-10: the object, the cap or the name not passed on.
    assert document({"a": [1, "é"]}, cap=100, what="x") == '{"a":[1,"é"]}'
    with pytest.raises(PayloadTooLarge, match=r"^the payload is 16 bytes; the cap is 12$"):
        document({"a": [1, "é"]}, cap=12, what="the payload")


def test_a_document_over_the_compact_bound_but_within_the_cap_is_sent_compact() -> None:
    """jsonb's rendering (a space after each ',' and ':') is what the CHECK measures; a
    document is measured that way when the quick bound is over the cap. Kills _encode
    mutants 38 (ensure_ascii lost in the rendering: "é" would count six bytes)."""
    doc = {"k": "é" * 40, "l": [1, 2, 3]}  # rendered: 105 bytes; compact + 5 separators
    compact = value(doc, cap=200, what="x")
    assert compact == '{"k":"' + "é" * 40 + '","l":[1,2,3]}'
    rendered = len(compact.replace(",", ", ").replace(":", ": ").encode())
    assert value(doc, cap=rendered, what="x") == compact  # exactly the cap: sent
    # Separators inside strings put the quick bound over the rendering itself:
    # the rendering is measured, and a document of exactly the cap is sent (mutant 50).
    inside = {"k": "a,b:c"}  # compact 13 bytes + 3 separators; rendered 14
    assert value(inside, cap=14, what="x") == '{"k":"a,b:c"}'
    with pytest.raises(PayloadTooLarge) as raised:
        value(doc, cap=rendered - 1, what="the params")
    # _encode mutant 51: the message says what, how big and the cap.
    assert str(raised.value) == f"the params is {rendered} bytes; the cap is {rendered - 1}"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (float("nan"), "the result is not JSON-serialisable: Out of range float values"),
        ({"n": float("inf")}, "the result is not JSON-serialisable: Out of range float values"),
        ({"s": {1, 2}}, "the result is not JSON-serialisable: Object of type set"),
        ("a\x00b", "the result contains a NUL character, which jsonb cannot store"),
        (["\\", "\x00"], "the result contains a NUL character, which jsonb cannot store"),
        ([{"a": {1: "x"}}], "the result has an object key that is not a string: 1 (int)"),
        ({"a": [{None: 1}]}, "the result has an object key that is not a string: None (NoneType)"),
    ],
)
def test_a_value_jsonb_cannot_hold_is_refused_with_what_is_wrong(bad: Any, message: str) -> None:
    """Kills _encode mutants 2, 6, 7, 12, 16, 20, 22 and 25-28, and _key_not_text 1:
    NaN let through, NUL let through, a non-text key written as text, messages lost."""
    with pytest.raises(ConfigurationError) as raised:
        value(bad, cap=1000, what="the result")
    assert str(raised.value).startswith(message), raised.value


def test_text_that_only_spells_a_nul_escape_is_stored() -> None:
    """A backslash then "u0000" is six characters, not a NUL: json.dumps escapes the
    backslash, and jsonb takes it. Kills _encode mutant 24 (refused on the spelling)."""
    assert value("\\u0000", cap=100, what="x") == '"\\\\u0000"'
    assert value({"p": "C:\\u0000"}, cap=100, what="x") == '{"p":"C:\\\\u0000"}'


def test_a_value_nested_too_deeply_is_refused_in_those_words() -> None:
    """Kills _encode mutant 23."""
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ConfigurationError) as raised:
        value(deep, cap=10**6, what="the step result")
    assert str(raised.value) == "the step result is nested too deeply to store"


@pytest.mark.parametrize(("bad", "kind"), [([1], "list"), ("s", "str"), (3, "int")])
def test_a_document_must_be_an_object(bad: Any, kind: str) -> None:
    """Kills document mutants 3 and 4."""
    with pytest.raises(ConfigurationError) as raised:
        document(bad, cap=100, what="the payload")
    assert str(raised.value) == f"the payload must be a JSON object (a mapping), not {kind}"
