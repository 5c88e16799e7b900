"""G9: no secret planted anywhere in an event payload survives into Postgres; caps hold."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb import tasks
from agentdb._db.jsonb import document
from agentdb.errors import ConfigurationError, PayloadTooLarge
from agentdb.redaction import DEFAULT, MASK, Redactor, configure, mask, redact
from tests.conftest import Tenants

# Secrets of every family the redactor knows, each with a distinctive tail so
# the test can look for it in the stored text.
SECRETS = st.sampled_from(
    [
        "sk-proj-{tail}aaaaaaaaaaaaaaaa",
        "Bearer {tail}xyzxyzxyz",
        "AKIA{tail}",
        "ghp_{tail}bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
        "xoxb-{tail}-cccccccccc",
        "eyJ{tail}hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig{tail}",
        "-----BEGIN RSA PRIVATE KEY-----\nMII{tail}\n-----END RSA PRIVATE KEY-----",
    ]
)
TAILS = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=16, max_size=16)
SECRET_KEYS = st.sampled_from(
    [
        "password",
        "api_key",
        "Authorization",
        "access_token",
        "client_secret",
        "X-Api-Key",
        "session_token",
        "cookie",
    ]
)
PLAIN = st.text(alphabet="abcdefghij klmnop", max_size=20)


@st.composite
def planted(draw: st.DrawFn) -> tuple[Any, list[str]]:
    """A nested payload with secrets hidden in values, inside text, and under secret keys."""
    hidden: list[str] = []

    def secret() -> str:
        tail = draw(TAILS)
        value = draw(SECRETS).format(tail=tail)
        hidden.append(tail)
        return value

    def node(depth: int) -> Any:
        kind = draw(st.integers(0, 6 if depth < 4 else 2))
        if kind == 0:
            return secret()
        if kind == 1:
            return f"{draw(PLAIN)} {secret()} {draw(PLAIN)}"
        if kind == 2:
            return draw(PLAIN | st.integers() | st.booleans() | st.none())
        if kind == 3:
            return [node(depth + 1) for _ in range(draw(st.integers(0, 3)))]
        if kind == 4:
            return {draw(SECRET_KEYS): node(depth + 1), draw(PLAIN): node(depth + 1)}
        if kind == 5:
            return {secret(): node(depth + 1)}  # a secret as a key
        return {draw(PLAIN): node(depth + 1) for _ in range(draw(st.integers(0, 3)))}

    return {"root": node(0), "under": {draw(SECRET_KEYS): secret()}}, hidden


@given(planted())
def test_G9_no_planted_secret_survives_redaction(case: tuple[Any, list[str]]) -> None:
    payload, tails = case
    text = json.dumps(redact(payload))
    for tail in tails:
        assert tail not in text


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=planted())
async def test_G9_redacted_payloads_are_accepted_and_store_no_secret(
    case: tuple[Any, list[str]],
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
) -> None:
    payload, tails = case
    task = await tasks.create(pool, tenants.a, "t")
    await tasks.transition(
        pool, tenants.a, task.id, expected_version=0, to_state="cancelled", payload=payload
    )
    stored = await admin_conn.fetchval(
        "SELECT payload::text FROM agent_events WHERE task_id = $1 AND task_state_version = 1",
        task.id,
    )
    for tail in tails:
        assert tail not in stored


@pytest.mark.parametrize(
    "glued",
    [
        "AKIAIOSFODNN7EXAMPLE" * 2,
        "AKIAIOSFODNN7EXAMPLE" + "sk-" + "a" * 20,
        "sk-" + "a" * 20 + "AKIAIOSFODNN7EXAMPLE" * 3,
        "sk-proj-" + "a" * 20 + "Bearer " + "t" * 20,
    ],
    ids=["akia-akia", "akia-sk", "sk-akia-x3", "sk-bearer"],
)
async def test_G9_secrets_glued_together_are_all_masked_and_the_payload_is_stored(
    glued: str, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The first secret's mask used to leave the next one behind a "]", where the
    database's check found it: SecretInPayload for a payload redact() had passed."""
    redacted = redact({"note": glued, "key": {glued: 1}})
    assert set(redacted["note"].split(MASK)) == {""}, redacted
    assert list(redacted["key"]) == ["[redacted key 0]"]
    task = await tasks.create(pool, tenants.a, "t")
    await tasks.transition(
        pool, tenants.a, task.id, expected_version=0, to_state="cancelled", payload={"n": glued}
    )


def test_G9_large_values_become_references() -> None:
    prompt = "You are a helpful assistant. " * 100
    out = redact({"prompt": prompt, "short": "ok"})
    assert out["short"] == "ok"
    assert out["prompt"]["bytes"] == len(prompt)
    assert out["prompt"]["$ref"].startswith("sha256:")


def test_G9_extra_patterns_are_configurable() -> None:
    r = Redactor(extra_keys="ssn", extra_patterns=(r"\b\d{3}-\d{2}-\d{4}\b",))
    assert r.redact({"ssn": "x", "note": "id 123-45-6789 here"}) == {
        "ssn": MASK,
        "note": f"id {MASK} here",
    }


async def test_G9_payload_over_the_cap_is_refused_and_nothing_is_written(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    many = {f"k{i}": "v" * 100 for i in range(100)}  # each value small, the whole too big
    with pytest.raises(PayloadTooLarge):
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=0, to_state="cancelled", payload=many
        )
    assert (await tasks.get(pool, tenants.a, task.id)).state_version == 0
    n = await admin_conn.fetchval("SELECT count(*) FROM agent_events WHERE task_id = $1", task.id)
    assert n == 1  # only the creation event


# The walk of agentdb_jsonb_has_secrets without its prefilter: what the CHECK
# must refuse. The prefilter may only skip documents this finds clean.
_WALK = """
SELECT EXISTS (
    SELECT 1 FROM jsonb_path_query($1::jsonb, 'strict $.**') AS node (v)
    WHERE (jsonb_typeof(node.v) = 'object'
           AND EXISTS (SELECT 1 FROM jsonb_each(node.v) AS kv (key, value)
                       WHERE agentdb_is_secret_key(kv.key)
                         AND kv.value <> '"[redacted]"'::jsonb))
       OR (jsonb_typeof(node.v) = 'string' AND agentdb_is_secret_value(node.v #>> '{}')))
"""
_KEY_PARTS = ["access", "refresh", "id", "auth", "session", "api", "private", "x", "Id", "ACCESS"]
_KEY_PARTS.append("")
_KEY_GLUE = ["", "_", "-", " "]
_KEY_TAILS = ["token", "tokens", "Token", "key", "TOKEN_used", "passwd", "cookie", "secret"]
KEYS = st.builds(
    lambda a, g, b: a + g + b,
    st.sampled_from(_KEY_PARTS),
    st.sampled_from(_KEY_GLUE),
    st.sampled_from(_KEY_TAILS),
)
VALUES = st.one_of(
    st.integers(0, 10**6),
    st.sampled_from(["[redacted]", "gpt-x", "tokens", "sk-" + "a" * 20, "Bearer abcdefgh12345678"]),
)
DOCS = st.recursive(
    st.dictionaries(KEYS, VALUES, max_size=3),
    lambda inner: st.dictionaries(KEYS, st.one_of(VALUES, inner), max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=DOCS)
async def test_G9_the_prefilter_skips_only_documents_the_walk_finds_clean(
    doc: dict[str, Any], admin_conn: asyncpg.Connection
) -> None:
    text = json.dumps(doc)
    checked = await admin_conn.fetchval("SELECT agentdb_jsonb_has_secrets($1::jsonb)", text)
    assert checked == await admin_conn.fetchval(_WALK, text), text


async def test_G9_a_cost_in_tokens_is_no_secret(admin_conn: asyncpg.Connection) -> None:
    costs = ({"cost": {"tokens": 8000}}, {"spent": {"tokens": 5321}, "released": {"tokens": 2679}})
    for doc in costs:
        found = await admin_conn.fetchval(
            "SELECT agentdb_jsonb_has_secrets($1::jsonb)", json.dumps(doc)
        )
        assert found is False


# Keys and strings full of the characters the size bound counts (',' and ':'
# inside strings get no space in jsonb's rendering) and of multi-byte ones.
_TEXT = st.text(alphabet=st.sampled_from(list(',: a\u00e9\u20ac\U0001f600"\\')), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=st.dictionaries(_TEXT, _JSON, max_size=5), slack=st.integers(-3, 3))
async def test_G9_document_refuses_exactly_what_jsonb_renders_over_the_cap(
    doc: dict[str, Any], slack: int, admin_conn: asyncpg.Connection
) -> None:
    """The client-side cap check (its one-encoding bound included) agrees with the size
    the CHECKs measure, octet_length(payload::text), at and around the cap."""
    text = json.dumps(doc, ensure_ascii=False)
    rendered = await admin_conn.fetchval("SELECT octet_length($1::jsonb::text)", text)
    cap = max(2, rendered + slack)
    if rendered > cap:
        with pytest.raises(PayloadTooLarge):
            document(doc, cap=cap, what="payload")
    else:
        assert document(doc, cap=cap, what="payload") is not None


# What mutmut found no test for (`make mutate-python MODULES=agentdb/redaction.py`).
# Each test builds its own Redactor: the module's default is built at import, before
# a mutant of the constructor could be switched on, so only a new one shows it.


def test_G9_a_key_naming_a_secret_is_found_in_any_case_and_an_ordinary_key_is_not() -> None:
    """Kills mutmut's __post_init__ mutants 4, 5 and 20: IGNORECASE dropped, an empty
    alternative that matches every key, and the last default key name garbled."""
    r = Redactor()
    assert r.redact({"PASSWORD": "a", "Api_Key": "b", "SIGNATURE": "c", "signature": "d"}) == {
        "PASSWORD": MASK, "Api_Key": MASK, "SIGNATURE": MASK, "signature": MASK,
    }  # fmt: skip
    assert r.redact({"city": "Lyon", "count": 3}) == {"city": "Lyon", "count": 3}
    extra = Redactor(extra_keys="tenant_pin")
    assert extra.redact({"Tenant_PIN": "1234", "city": "Lyon"}) == {
        "Tenant_PIN": MASK, "city": "Lyon",
    }  # fmt: skip


def test_G9_masked_stretches_merge_when_they_touch_and_each_apart_stays_apart() -> None:
    """Kills mutmut's _mask mutants 12, 18, 19, 20, 21 and 22: touching stretches
    masked twice, the walk stopped after a merge, and the text between stretches lost."""
    r = Redactor(extra_patterns=("foo", "bar", "ab", "bc", "xyz"))
    assert r.mask("foobar") == MASK  # (0, 3) and (3, 6) touch: one mask
    assert r.mask("abc-xyz") == f"{MASK}-{MASK}"  # a merge, then a stretch after it
    assert r.mask("1 xyz 2 xyz 3 xyz 4") == f"1 {MASK} 2 {MASK} 3 {MASK} 4"
    # Three stretches chained by overlaps are one: stopped after the first merge, the
    # third would be cut at the mask and no pattern would find what is left of it.
    chained = Redactor(extra_patterns=("abc", "bcd", "cdefgh"))
    assert chained.mask("abcdefgh") == MASK


def test_G9_a_value_of_exactly_the_limit_stays_and_one_byte_more_is_a_reference() -> None:
    """Kills mutmut's _string mutants 12 (> to >=) and 13 (no digest)."""
    r = Redactor(max_value_bytes=16)
    assert r.redact({"v": "é" * 8}) == {"v": "é" * 8}  # 16 bytes in UTF-8
    longer = "é" * 8 + "!"
    digest = hashlib.sha256(longer.encode()).hexdigest()
    assert r.redact({"v": longer}) == {"v": {"$ref": f"sha256:{digest}", "bytes": 17}}


def test_G9_mask_keeps_long_values_at_every_depth_and_every_item() -> None:
    """Kills mutmut's _walk mutants 5, 20, 21, 22, 23 and 24: the refs flag lost on
    the way down (a long value read back as a reference) or the list items replaced."""
    r = Redactor(max_value_bytes=4)
    long = "x" * 10
    value = [long, {"a": long, "b": [long, 1, None]}, "sk-" + "a" * 20]
    assert r.mask(long) == long
    assert r.mask(value) == [long, {"a": long, "b": [long, 1, None]}, MASK]
    assert r.redact({"l": [long]})["l"][0]["$ref"].startswith("sha256:")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({1: "x"}, "the event payload has an object key that is not a string: 1"),
        ({"s": "\ud800"}, "the event payload is not valid Unicode: "),
    ],
)
def test_G9_a_payload_the_redactor_cannot_take_is_refused_with_what_is_wrong(
    payload: dict[Any, Any], message: str
) -> None:
    """Kills mutmut's _walk mutant 9 and redact mutant 6 (the message replaced by None)."""
    with pytest.raises(ConfigurationError) as raised:
        Redactor().redact(payload)
    assert str(raised.value).startswith(message), raised.value


def test_G9_a_value_mask_cannot_take_is_refused_with_what_is_wrong() -> None:
    """Kills mutmut's mask mutant 9 (the message replaced by None)."""
    with pytest.raises(ConfigurationError) as raised:
        Redactor().mask(["\ud800"])
    assert str(raised.value).startswith("the value is not valid Unicode: "), raised.value


def test_G9_a_payload_nested_too_deeply_is_refused_in_those_words() -> None:
    """Kills mutmut's redact mutants 3, 4 and 5 and mask mutants 6, 7 and 8 (the
    message gone, garbled or shouted)."""
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ConfigurationError) as raised:
        Redactor().redact(deep)
    assert str(raised.value) == "the event payload is nested too deeply"
    with pytest.raises(ConfigurationError) as raised:
        Redactor().mask(deep)
    assert str(raised.value) == "the value is nested too deeply"


def test_G9_the_configured_redactor_is_the_one_redact_and_mask_use() -> None:
    """Kills mutmut's configure mutant 1 and module-level mask mutant 1 (never reached)."""
    configure(Redactor(extra_keys="pin", max_value_bytes=4))
    try:
        assert redact({"pin": "1", "v": "12345"})["pin"] == MASK
        assert mask({"pin": "1", "v": "12345"}) == {"pin": MASK, "v": "12345"}
    finally:
        configure(DEFAULT)
    assert redact({"pin": "1"}) == {"pin": "1"}
