"""Canonical input hashing (G4): equal meaning hashes equal; different inputs hash different."""

from __future__ import annotations

import unicodedata
from decimal import Decimal
from typing import Any, Literal

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agentdb.errors import ConfigurationError
from agentdb.hashing import canonical_json, input_hash

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_data = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _shuffle_keys(value: Any, rnd: st.DataObject) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        order = rnd.draw(st.permutations(range(len(items))))
        return {items[i][0]: _shuffle_keys(items[i][1], rnd) for i in order}
    if isinstance(value, list):
        return [_shuffle_keys(v, rnd) for v in value]
    return value


def _renormalise(value: Any, form: Literal["NFC", "NFD"]) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize(form, value)
    if isinstance(value, dict):
        return {unicodedata.normalize(form, k): _renormalise(v, form) for k, v in value.items()}
    if isinstance(value, list):
        return [_renormalise(v, form) for v in value]
    return value


def _reformat_numbers(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _reformat_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reformat_numbers(v) for v in value]
    return value


@given(json_data, st.data())
def test_G4_key_order_does_not_change_the_hash(value: Any, data: st.DataObject) -> None:
    assert input_hash(_shuffle_keys(value, data)) == input_hash(value)


@given(json_data)
def test_G4_unicode_normalisation_does_not_change_the_hash(value: Any) -> None:
    nfd = _renormalise(value, "NFD")
    try:
        expected = input_hash(_renormalise(value, "NFC"))
    except ConfigurationError:
        assume(False)  # two keys collapse into one under NFC: refused, by design
    assert input_hash(nfd) == expected


@given(json_data)
def test_G4_number_formatting_does_not_change_the_hash(value: Any) -> None:
    assert input_hash(_reformat_numbers(value)) == input_hash(value)


@given(json_data, json_data)
def test_G4_different_inputs_hash_differently(a: Any, b: Any) -> None:
    assume(canonical_json(a) != canonical_json(b))
    assert input_hash(a) != input_hash(b)


@given(json_data)
def test_canonical_json_is_valid_json_with_the_same_meaning(value: Any) -> None:
    import json

    parsed = json.loads(canonical_json(value), parse_float=Decimal, parse_int=Decimal)
    assert canonical_json(parsed) == canonical_json(value)


def test_known_vectors() -> None:
    assert canonical_json({"b": 1.0, "a": [100, 1.5, Decimal("1.00"), -0.0, 0.1]}) == (
        b'{"a":[1e2,15e-1,1,0,1e-1],"b":1}'
    )
    assert canonical_json(True) != canonical_json(1)
    assert canonical_json("1") != canonical_json(1)
    assert input_hash({}) == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), b"bytes", {1: "int key"}, {"é": 1, "e\u0301": 2}, {1, 2}]
)
def test_non_json_inputs_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        input_hash(bad)
