"""Mechanical SQL mutants, generated from the parse tree (``python -m dev.mutate --generated``).

The hand catalogue (catalogue.py) holds the breakages someone thought of; this
module derives the rest mechanically, from pglast's parse of (libpg_query,
Postgres' own parser):

* every statement of ``agentdb/queries/*.sql``, ``agentdb/_citus/queries/*.sql`` and
  ``agentdb/_db/queries/*.sql`` (split at their ``-- name: X :kind`` headers, as
  agentdb/_db/sqlfile.py does);
* in ``sql/migrations/*.sql`` (not the rollbacks): the CHECK constraints, the
  WHEN clauses of triggers, the USING / WITH CHECK of policies, and the bodies
  of the functions and procedures - ``LANGUAGE sql`` bodies parsed as SQL,
  PL/pgSQL bodies through ``parse_plpgsql``, whose every embedded expression
  and statement is found again in the body (by its line and text) and parsed.
  Only the definition that is current is mutated: a routine (or trigger,
  policy, constraint) that a later migration defines again is mutated in the
  latest one, and one a later migration drops is not mutated at all; a routine
  is also taken as redefined when a later migration's text has
  ``CREATE [OR REPLACE] FUNCTION|PROCEDURE name(`` anywhere (the rule of
  tests/test_mutants.py, which the generator's test applies to every mutant).

The operators (``op`` in the id), each one exact edit of the file:

``cmp``     flip a comparison: ``<``/``<=``, ``>``/``>=``, ``=``/``<>`` (also in
            ``= ANY``/``<> ALL``);
``and``     replace one conjunct of an AND by ``true``, where the AND is a
            condition: WHERE, JOIN ... ON, CASE WHEN, trigger WHEN, CHECK,
            policy USING / WITH CHECK, and PL/pgSQL IF/ELSIF/WHILE/EXIT WHEN;
``tenant``  replace a ``<x>.tenant_id = ...`` (or ``... = <x>.tenant_id``)
            equality in such a condition by ``true``;
``list``    remove one element of an IN list or ``ARRAY[...]`` of string
            literals (two or more of them);
``lock``    remove a ``FOR UPDATE`` / ``FOR NO KEY UPDATE`` / ``FOR SHARE`` /
            ``FOR KEY SHARE`` clause (with its OF and SKIP LOCKED / NOWAIT), or
            only its ``SKIP LOCKED``;
``raise``   replace a PL/pgSQL ``RAISE EXCEPTION ...;`` by ``NULL;``;
``int``     move an integer literal that bounds something (an operand of a
            comparison or BETWEEN, or a LIMIT) by +1 and by -1.

An edit is located by the parse tree's ``location`` offsets (an expression's
extent: from its first token to the shortest end whose text parses back to the
same tree), so comments are never mutated. ``find`` is the edited text with
whole lines around it, grown a line at a time until it occurs exactly once in
the file (a mutant that cannot be made unique within a few lines is skipped).
Two operators giving the same edit give one mutant (the first in the order
above). Ids are ``gen-<file stem>-<statement or object>-<op>-<n>``, ``n``
counting that object's mutants of that operator in text order: the same
sources give the same ids.

The tests of a mutant (``tests``), by a fixed, explicit heuristic:

* a statement of ``agentdb/queries/<x>.sql``: its users are the modules of
  ``agentdb/`` (not agentdb/tools) that name it (``_Q["name"]``, or the name in
  quotes); each user ``agentdb/<m>.py`` maps to ``tests/test_<m>.py`` when it
  exists, and to the files ``_MODULE_TESTS`` names for it; ``_STATEMENT_TESTS``
  adds the files that prove what a statement's module tests miss;
* a statement of ``agentdb/_citus/queries``: a Citus mutant (``citus=True``,
  run by ``--generated --citus`` on ``AGENTDB_CITUS_DSN``), tested by the plain
  twin's module tests (``_ROUTED_TESTS``, by the word after ``routed_``) and
  tests/test_fences.py; so is a statement of ``agentdb/queries`` only a distributed
  schema runs (``_CITUS_STATEMENTS``, with the cluster tests that run it);
* a migration object: tests/test_fences.py, plus the cases of
  tests/test_attacks.py that attack it by name - the CHECK constraint or
  trigger itself; for a routine, the triggers that execute it - (their exact
  node ids, so a mutant runs seconds of attacks, not the whole file), plus, for
  a routine, ``tests/test_<m>.py`` of every statement file
  ``agentdb/queries/<m>.sql`` that calls it and the test files that name it
  (``_ROUTINE_TESTS`` overrides both); with no attack case and no such file,
  the whole of tests/test_attacks.py; ``_STATEMENT_TESTS`` adds, by the object's (or a
  caller's) name, the files that prove what its attack cases miss.

Declared-equivalent mutants are listed, reviewed, in
``dev/mutate/equivalent_generated.txt`` (``id: reason`` a line, ``#`` comments).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pglast import parser as pg

from dev.mutate.catalogue import Mutant

__all__ = [
    "EQUIVALENT_FILE",
    "OPERATORS",
    "Generated",
    "generate",
    "generated_mutants",
    "read_equivalent",
    "sample",
]

ROOT = Path(__file__).resolve().parents[2]
QUERY_DIRS = ("agentdb/queries", "agentdb/_citus/queries", "agentdb/_db/queries")
MIGRATIONS = "sql/migrations"
EQUIVALENT_FILE = "dev/mutate/equivalent_generated.txt"
OPERATORS = ("tenant", "and", "cmp", "list", "lock", "raise", "int")

ATTACKS = "tests/test_attacks.py"
FENCES = "tests/test_fences.py"
# Every CHECK at its edges, in one test of a few seconds: the first target of a CHECK's
# mutants and of the routines a CHECK calls (the attacks show a rule is enforced, not where
# its line is: a bound moved by one, a state dropped from its list, survived them).
CHECK_EDGES = (
    "tests/test_check_edges.py::test_G5_every_check_takes_its_edge_and_refuses_one_past_it"
)
# Statement modules whose behaviour other files show: the files that exercise them,
# besides tests/test_<module>.py where it exists.
_MODULE_TESTS: dict[str, tuple[str, ...]] = {
    "_explain": (FENCES,),  # why a fenced write matched nothing: StaleVersion, LeaseLost
    "_mcp_calls": ("tests/integrations/test_mcp.py",),
    "inbox": ("tests/test_outbox.py",),
    # A reservation's budget holds and rate-limit windows (G19) are proven by the budget
    # tests, which tests/test_operations.py never sets up.
    "operations": ("tests/test_budgets.py",),
    "schema": ("tests/test_schema_check.py",),
    "steps": ("tests/test_durable.py",),
}
# Statements whose module's own tests miss what other files prove (the first seeded
# sample: these mutants survived tests/test_<module>.py and were killed by these); also
# migration objects (a CHECK, trigger or policy by name) whose attack cases miss them.
_STATEMENT_TESTS: dict[str, tuple[str, ...]] = {
    # The fences (a take-over, a stale holder's write) and the deadlines (a late task
    # under an expired lease) are proven apart from the statements' module tests.
    # The claim's reads under a held snapshot (the walk's bounds) are counted apart.
    "lease_claim": (
        "tests/test_fairness.py",
        FENCES,
        "tests/test_deadlines.py",
        "tests/test_held_snapshot.py",
    ),
    "lease_release": (FENCES,),
    "lease_renew": (FENCES,),
    # A wait for children is a transition to waiting with a count: the fan-in tests wait.
    "task_transition": (FENCES, "tests/test_children.py"),
    "operation_settle": (FENCES,),  # test_operations settles without a lease
    "operation_complete_many": ("tests/test_complete_many.py",),
    "operation_reserve_many": ("tests/test_complete_many.py", "tests/test_tenant_isolation.py"),
    "task_finish_many": ("tests/test_complete_many.py", FENCES),
    "operation_get": (FENCES, "tests/test_tenant_isolation.py", "tests/test_complete_many.py"),
    "outbox_deliver_and_claim": ("tests/test_relay.py", FENCES),
    # A state dropped from the list is refused only when a task reaches it: a failure
    # (tests/test_tasks.py), a worker's failed attempt (tests/test_worker.py).
    "agent_tasks_state_valid": ("tests/test_tasks.py", "tests/test_worker.py"),
    # The deadline sweep and guard, in every state a task can be late in: the sweep's
    # module tests (test_leases) never run it, and no attack case holds a waiting task.
    "lease_expire_deadlines": ("tests/test_deadlines.py",),
    "agent_tasks_deadline_guard": ("tests/test_deadlines.py",),
    "agentdb_guard_deadline": ("tests/test_deadlines.py",),
    # Which signal a wait finds already sent (and which it has read) is shown by the
    # signal tests, not by the guard's refusals.
    "agentdb_guard_signal_cursor": ("tests/test_signals.py",),
    # What a signal writes (its event, the wake) is read back by the signal tests; the
    # fences' and access tests only send one.
    "agentdb_deliver_signal": ("tests/test_signals.py",),
    # The signal's two foreign keys are checked first by agentdb_signal_access, under the
    # constraints' names: their attack cases read which one refused.
    "agentdb_signal_access": (
        "tests/test_attacks.py::test_attack_is_refused[G2-agent_signals_tenant_fkey]",
        "tests/test_attacks.py::test_attack_is_refused[G2-agent_signals_task_fkey]",
    ),
    # Which of a child's writes wake its waiting parent (a finish, once; not a claim, not a
    # write that keeps it finished) is shown by the fan-in tests: the trigger's attack case
    # only shows that a child's finish reaches its parent.
    "agent_tasks_fan_in": ("tests/test_children.py",),
    # Whether a wait for children is due at once (its quorum already finished) is read by
    # the fan-in tests; the guard's attack cases only refuse a wait it may not begin.
    "agentdb_guard_children_wait": ("tests/test_children.py",),
    # A retried operation counts a call: the budget tests retry under a rate limit.
    "agent_operations_rate_limit_retry": ("tests/test_budgets.py",),
    # The pool's session setting: the worker's process and the pool tests read it back.
    "pool_generic_plans": ("tests/test_worker.py",),
    # The retention steps of the audit trail read agent_events_expiry_idx (0023.event_expiry):
    # tests/test_indexes.py counts the purge's index scans and reads the backlog's plan.
    "agentdb_purge": ("tests/test_indexes.py",),
    "agentdb_purge_tenant": ("tests/test_indexes.py",),
    "status_purge_backlog": ("tests/test_indexes.py",),
}
# routed_<word>_...: the plain statements' module whose twin it is.
_ROUTED_TESTS: dict[str, str] = {
    "budget": "tests/test_budgets.py",
    "operation": "tests/test_operations.py",
    "outbox": "tests/test_outbox.py",
    "task": "tests/test_tasks.py",
    "tenant": "tests/test_tenancy.py",
}
_ROUTED_DEFAULT = "tests/test_leases.py"  # the claim, release, bury and deadline sweep
_CITUS_TESTS = ("tests/citus/test_citus.py",)
# Statements of agentdb/queries that only a distributed schema runs (they read the citus
# extension's own views): Citus mutants, tested on the cluster - on plain Postgres no
# test reaches them, so every mutant of theirs would survive there.
_CITUS_STATEMENTS: dict[str, tuple[str, ...]] = {
    "status_processes_citus": ("tests/citus/test_citus_nodes.py",),
}
# Routines only a distributed schema runs, and routines whose tests the name
# search would not find (or would find too many of).
# agentdb_distributed answers false at once where there is no pg_dist_partition: only a
# Citus cluster runs the rest of it.
_CITUS_ROUTINES = frozenset(
    {
        "agentdb_distribute",
        "agentdb_distribute_like",
        "agentdb_distributed",
        # The routed claim and transition (0021.delegated_writes): the Citus runtime's,
        # as routed.sql's statements are; their tests are the Citus suites.
        "agentdb_routed_claim",
        "agentdb_routed_transition",
    }
)
_ROUTINE_TESTS: dict[str, tuple[str, ...]] = {
    "agentdb_partition_events": ("tests/test_events_by_month.py",),
    "agentdb_unpartition_events": ("tests/test_events_by_month.py",),
    "agentdb_move_access": ("tests/test_events_by_month.py",),
    "agentdb_require_event_by_month": ("tests/test_events_by_month.py",),
    "agentdb_event_records_once": ("tests/test_events_by_month.py",),
    "agentdb_signal_access": ("tests/test_access.py", "tests/test_signals.py"),
    "agentdb_keep_parent": ("tests/test_children.py", "tests/test_tenant_deletion.py"),
    "agentdb_delete_tenant": ("tests/test_tenant_deletion.py", "tests/test_tenancy.py"),
    "agentdb_grant_roles": ("tests/test_access.py", "tests/test_tenant_isolation.py"),
    "agentdb_request_task": ("tests/test_access.py",),
    "agentdb_current_tenant": ("tests/test_access.py", "tests/test_tenant_isolation.py"),
    "agentdb_scope_tenant": ("tests/test_access.py", "tests/test_tenant_isolation.py"),
}
# Test files never picked by the name search: they read the SQL as text (docs,
# layout, the mutants themselves) or are too slow to run per mutant.
_NOT_BY_NAME = frozenset(
    {
        "tests/test_mutants.py",
        "tests/test_mutant_generator.py",
        "tests/test_docs.py",
        "tests/test_readme.py",
        "tests/test_layout.py",
        "tests/test_schema_state.py",
        "tests/test_migrations.py",
        "tests/test_audit.py",
        "tests/test_audit_peers.py",
        "tests/test_audit_random_schemas.py",
        "tests/test_bench.py",
        "tests/test_hot_functions.py",
        "tests/test_statements.py",
        "tests/test_routed_twins.py",
        ATTACKS,
    }
)
_MAX_BY_NAME = 3  # a routine more test files name than this is everywhere: none are picked

_FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "=": "<>", "<>": "="}
_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*) (:[a-z]+)\s*$")
_ROUTINE_TEXT = re.compile(r"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE) (\w+)\(", re.I)
_STRENGTH = (("UPDATE",), ("SHARE",), ("NO", "KEY", "UPDATE"), ("KEY", "SHARE"))
_MAX_WINDOW_LINES = 8
_MAX_SPAN_TOKENS = 600
_LINE = "<line>"  # in a `what`: the file's line of the edit
_SKIPPED_TOKENS = frozenset({"SQL_COMMENT", "C_COMMENT"})


@dataclass(frozen=True, slots=True)
class Generated:
    """A generated mutant with where it came from (for counts and the tests)."""

    mutant: Mutant
    op: str
    unit: str  # the statement, routine, constraint, trigger or policy
    kind: str  # statement | routine | check | trigger | policy


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int  # offsets in the file
    end: int
    replace: str
    op: str
    what: str


@dataclass(frozen=True, slots=True)
class _Token:
    start: int
    stop: int  # exclusive
    name: str


@dataclass(frozen=True, slots=True)
class _Unit:
    """One thing to mutate: a statement or a migration object, with its tests."""

    path: str
    name: str
    kind: str
    tests: tuple[str, ...]
    citus: bool = False


# ---- text, tokens, parse trees ------------------------------------------------------------------


class _Src:
    """A text handed to the parser, placed in its file: file offset = at + (char - prefix)."""

    def __init__(self, text: str, at: int, prefix: int = 0) -> None:
        self.text = text
        self.at = at
        self.prefix = prefix
        self._bytes: list[int] | None = None
        if not text.isascii():  # pglast's offsets count UTF-8 bytes
            self._bytes = [i for i, ch in enumerate(text) for _ in ch.encode()]
            self._bytes.append(len(text))
        self.tokens = [
            _Token(self.char(t.start), self.char(t.end) + 1, t.name)
            for t in pg.scan(text)
            if t.name not in _SKIPPED_TOKENS
        ]
        self._by_start = {t.start: i for i, t in enumerate(self.tokens)}

    def char(self, byte: int) -> int:
        return byte if self._bytes is None else self._bytes[byte]

    def file(self, char: int) -> int:
        return self.at + char - self.prefix

    def token_at(self, char: int) -> int | None:
        return self._by_start.get(char)


@functools.lru_cache(maxsize=256)
def _json(text: str) -> str:
    return pg.parse_sql_json(text)


def _tree(text: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(_json(text))
    return parsed


def _node(value: Any) -> tuple[str, dict[str, Any]] | None:
    """(type, fields) of a wrapped node ``{"Type": {...}}``, else None."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, body),) = value.items()
        if key[:1].isupper() and isinstance(body, dict):
            return key, body
    return None


def _strip(value: Any) -> Any:
    """A tree without its positions, to compare two parses of the same expression."""
    if isinstance(value, dict):
        return {
            k: _strip(v)
            for k, v in value.items()
            if not (k.endswith("location") or k.startswith("rexpr_list_"))
        }
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _locations(value: Any) -> Iterator[int]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "location" and isinstance(v, int) and v >= 0:
                yield v
            else:
                yield from _locations(v)
    elif isinstance(value, list):
        for v in value:
            yield from _locations(v)


def _sval(value: Any) -> str | None:
    found = _node(value)
    if found and found[0] == "String":
        sval = found[1].get("sval")
        return sval if isinstance(sval, str) else None
    return None


def _ival(body: dict[str, Any]) -> int | None:
    """The value of an integer A_Const (JSON leaves a zero out)."""
    if "ival" not in body:
        return None
    value = body["ival"].get("ival", 0)
    return value if isinstance(value, int) else None


def _line_of(text: str, at: int) -> str:
    return _one_line(text[text.rfind("\n", 0, at) + 1 : (text + "\n").index("\n", at)])


def _one_line(text: str, limit: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ---- the operators on one parsed text -----------------------------------------------------------

# A child under one of these keys of a node of this type is a condition.
_CONDITIONS = frozenset(
    {
        ("SelectStmt", "whereClause"),
        ("UpdateStmt", "whereClause"),
        ("DeleteStmt", "whereClause"),
        ("OnConflictClause", "whereClause"),
        ("InferClause", "whereClause"),
        ("JoinExpr", "quals"),
        ("CaseWhen", "expr"),
        ("CreateTrigStmt", "whenClause"),
        ("CreatePolicyStmt", "qual"),
        ("CreatePolicyStmt", "with_check"),
    }
)
# Struct fields the JSON writes without their type's wrapper.
_UNWRAPPED = {"onConflictClause": "OnConflictClause", "infer": "InferClause"}


class _Walker:
    """Collects the edits of one parsed text (a statement or an expression)."""

    def __init__(self, src: _Src, out: list[_Edit], label: str) -> None:
        self.src = src
        self.out = out
        self.label = label

    # -- traversal --

    def walk(self, value: Any, cond: bool, key: str = "") -> None:
        if isinstance(value, list):
            for v in value:
                self.walk(v, cond, key)
            return
        if not isinstance(value, dict):
            return
        found = _node(value)
        typ, body = found if found else (_UNWRAPPED.get(key, "?"), value)
        self._visit(typ, body, cond)
        for k, child in body.items():
            if typ == "BoolExpr":
                child_cond = cond
            elif typ == "Constraint":
                child_cond = k == "raw_expr" and body.get("contype") == "CONSTR_CHECK"
            else:
                child_cond = (typ, k) in _CONDITIONS
            self.walk(child, child_cond, k)

    def _visit(self, typ: str, body: dict[str, Any], cond: bool) -> None:
        if typ == "A_Expr":
            self._a_expr(body, cond)
        elif typ == "BoolExpr" and cond and body.get("boolop") == "AND_EXPR":
            for arg in body.get("args", []):
                self._to_true(arg, "and", "conjunct")
        elif typ == "A_ArrayExpr":
            self._strings(body.get("elements", []), "ARRAY element")
        elif typ == "SelectStmt":
            found = _node(body.get("limitCount"))
            if found and found[0] == "A_Const":
                self._int(found[1], limit=True)

    def _a_expr(self, body: dict[str, Any], cond: bool) -> None:
        kind = body.get("kind", "AEXPR_OP")
        names = body.get("name", [])
        op = _sval(names[0]) if len(names) == 1 else None
        if kind in ("AEXPR_OP", "AEXPR_OP_ANY", "AEXPR_OP_ALL") and op in _FLIP:
            self._cmp(body, op)
            if kind == "AEXPR_OP":
                for side in ("lexpr", "rexpr"):
                    found = _node(body.get(side))
                    if found and found[0] == "A_Const":
                        self._int(found[1])
            if kind == "AEXPR_OP" and op == "=" and cond and self._tenant_side(body):
                self._to_true({"A_Expr": body}, "tenant", "tenant equality")
        elif kind in ("AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN", "AEXPR_BETWEEN_SYM"):
            bounds = _node(body.get("rexpr"))
            for item in bounds[1].get("items", []) if bounds else []:
                found = _node(item)
                if found and found[0] == "A_Const":
                    self._int(found[1])
        elif kind == "AEXPR_IN":
            items = _node(body.get("rexpr"))
            if items and items[0] == "List":
                self._strings(items[1].get("items", []), "IN element")

    @staticmethod
    def _tenant_side(body: dict[str, Any]) -> bool:
        for side in ("lexpr", "rexpr"):
            found = _node(body.get(side))
            if found and found[0] == "ColumnRef":
                fields = found[1].get("fields", [])
                if fields and _sval(fields[-1]) == "tenant_id":
                    return True
        return False

    # -- edits --

    def _edit(self, start: int, end: int, new: str, op: str, what: str) -> None:
        src = self.src
        self.out.append(_Edit(src.file(start), src.file(end), new, op, f"{self.label}: {what}"))

    def _token(self, body: dict[str, Any]) -> _Token | None:
        """The token a node's ``location`` points at."""
        loc = body.get("location", -1)
        i = self.src.token_at(self.src.char(loc)) if isinstance(loc, int) and loc >= 0 else None
        return None if i is None else self.src.tokens[i]

    def _cmp(self, body: dict[str, Any], op: str) -> None:
        tok = self._token(body)
        if tok is None:
            return
        old = self.src.text[tok.start : tok.stop]
        if old != op and not (op == "<>" and old == "!="):
            return
        new = _FLIP[op]
        self._edit(tok.start, tok.stop, new, "cmp", f"`{old}` -> `{new}` in `{_LINE}`")

    def _int(self, body: dict[str, Any], limit: bool = False) -> None:
        value = _ival(body)
        tok = self._token(body)
        if value is None or tok is None:
            return
        if tok.name != "ICONST" or self.src.text[tok.start : tok.stop] != str(value):
            return
        for new in (value + 1, value - 1):
            if new < 0 and limit:
                continue
            self._edit(tok.start, tok.stop, str(new), "int", f"{value} -> {new} in `{_LINE}`")

    def _strings(self, items: list[Any], what: str) -> None:
        toks: list[_Token] = []
        for item in items:
            found = _node(item)
            if not found or found[0] != "A_Const" or "sval" not in found[1]:
                return
            tok = self._token(found[1])
            if tok is None or tok.name != "SCONST":
                return
            toks.append(tok)
        if len(toks) < 2:
            return
        for n, tok in enumerate(toks):
            literal = self.src.text[tok.start : tok.stop]
            if n + 1 < len(toks):
                start, end = tok.start, toks[n + 1].start
            else:
                start, end = toks[n - 1].stop, tok.stop
            self._edit(start, end, "", "list", f"{what} {literal} removed")

    def _to_true(self, value: Any, op: str, what: str) -> None:
        span = self._span(value)
        if span is None:
            return
        start, end = span
        text = self.src.text[start:end]
        if text.lower() == "true":
            return
        params = {self.src.text[t.start : t.stop] for t in self.src.tokens if t.name == "PARAM"}
        kept = {
            self.src.text[t.start : t.stop]
            for t in self.src.tokens
            if t.name == "PARAM" and not start <= t.start < end
        }
        if params - kept:
            # The statement's last use of a $n: keep it (typed) in a conjunct that is true.
            new = f"({text} OR true)"
            self._edit(start, end, new, op, f"{what} `{_one_line(text)}` -> `(... OR true)`")
            return
        self._edit(start, end, "true", op, f"{what} `{_one_line(text)}` -> true")

    def _span(self, value: Any) -> tuple[int, int] | None:
        """Where an expression node's text is: its first token to the shortest end whose
        text parses back to the same tree (parentheses around it stay outside)."""
        locs = list(_locations(value))
        if not locs:
            return None
        start = self.src.char(min(locs))
        first = self.src.token_at(start)
        if first is None:
            return None
        want = _strip(value)
        depth = 0
        for tok in self.src.tokens[first : first + _MAX_SPAN_TOKENS]:
            if tok.name in ("ASCII_40", "ASCII_91"):
                depth += 1
            elif tok.name in ("ASCII_41", "ASCII_93"):
                depth -= 1
                if depth < 0:
                    return None
            if depth:
                continue
            text = self.src.text[start : tok.stop]
            try:
                stmts = _tree("SELECT " + text)["stmts"]
            except pg.ParseError:
                continue
            targets = stmts[0]["stmt"].get("SelectStmt", {}).get("targetList", [])
            if len(stmts) == 1 and len(targets) == 1:
                got = targets[0]["ResTarget"]
                if "name" not in got and _strip(got.get("val")) == want:
                    return start, tok.stop
        return None

    def locks(self) -> None:
        """FOR UPDATE / FOR SHARE clauses of this text (a statement), and their SKIP LOCKED."""
        toks = self.src.tokens
        names = [t.name for t in toks]
        for i, name in enumerate(names):
            if name != "FOR":
                continue
            strength = next(
                (s for s in _STRENGTH if tuple(names[i + 1 : i + 1 + len(s)]) == s), None
            )
            if strength is None:
                continue
            j = i + len(strength)
            if j + 1 < len(toks) and names[j + 1] == "OF":
                j += 1
                while j + 1 < len(toks) and names[j + 1] in ("IDENT", "ASCII_46", "ASCII_44"):
                    j += 1
            skip = names[j + 1 : j + 3] == ["SKIP", "LOCKED"]
            last = j + 2 if skip else j + 1 if names[j + 1 : j + 2] == ["NOWAIT"] else j
            clause = _one_line(self.src.text[toks[i].start : toks[last].stop])
            self._edit(toks[i].start, toks[last].stop, "", "lock", f"`{clause}` removed")
            if skip:
                self._edit(toks[j].stop, toks[j + 2].stop, "", "lock", "`SKIP LOCKED` removed")


# ---- sources ------------------------------------------------------------------------------------


def _statement_blocks(text: str) -> Iterator[tuple[str, int, str]]:
    """(name, offset, sql) of each statement of a statement file (sqlfile.py's split)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    heads = [i for i, line in enumerate(lines) if line.startswith("-- name:")]
    for n, head in enumerate(heads):
        m = _HEADER.match(lines[head].rstrip("\n"))
        if m is None:
            continue
        stop = heads[n + 1] if n + 1 < len(heads) else len(lines)
        body = head + 1
        while body < stop and lines[body].startswith("--"):
            body += 1
        yield m.group(1), offsets[body], text[offsets[body] : offsets[stop]]


def _walk_statement(src: _Src, tree: dict[str, Any], out: list[_Edit], label: str) -> None:
    walker = _Walker(src, out, label)
    for stmt in tree["stmts"]:
        walker.walk(stmt["stmt"], False)
    walker.locks()


def _walk_expression(
    src: _Src, tree: dict[str, Any], cond: bool, out: list[_Edit], label: str
) -> None:
    target = tree["stmts"][0]["stmt"]["SelectStmt"]["targetList"][0]["ResTarget"]["val"]
    _Walker(src, out, label).walk(target, cond)


class _Body:
    """A PL/pgSQL body: finds each embedded expression again by its line and text."""

    def __init__(self, file_text: str, start: int, end: int, out: list[_Edit], label: str) -> None:
        self.text = file_text[start:end]
        self.at = start
        self.out = out
        self.label = label
        self.src = _Src(self.text, start)
        self.lines = [0] + [m.end() for m in re.finditer("\n", self.text)]

    def walk(
        self, value: Any, lineno: int = 1, parent: str = "", key: str = "", into: bool = False
    ) -> None:
        if isinstance(value, list):
            for v in value:
                self.walk(v, lineno, parent, key, into)
            return
        if not isinstance(value, dict):
            return
        found = _node(value)
        if found is None:
            for k, v in value.items():
                self.walk(v, lineno, parent, k, into)
            return
        typ, body = found
        line = body.get("lineno", lineno)
        if typ == "PLpgSQL_expr":
            cond = key == "cond" or (parent == "PLpgSQL_case_when" and key == "expr")
            self._expr(body.get("query", ""), body.get("parseMode", 0), line, cond, into)
            return
        if typ == "PLpgSQL_stmt_raise":
            self._raise(body, line)
            return
        has_into = typ == "PLpgSQL_stmt_execsql" and bool(body.get("into"))
        for k, v in body.items():
            if k != "datums":
                self.walk(v, line, typ, k, has_into)

    def _find(self, query: str, lineno: int, into: bool) -> int | None:
        """Where ``query`` starts in the body, at or after its statement's line: PL/pgSQL
        hands an INTO target back blanked out and a PERFORM back as SELECT."""
        if lineno < 1 or lineno > len(self.lines):
            return None
        perform = query.startswith("SELECT ")
        for tok in self.src.tokens:
            if tok.start < self.lines[lineno - 1]:
                continue
            seg = self.text[tok.start : tok.start + len(query)]
            if len(seg) < len(query):
                return None
            if perform and seg[:7].upper() == "PERFORM":
                seg = "SELECT " + seg[7:]
            if seg == query or (
                into and all(a == b or b == " " for a, b in zip(seg, query, strict=True))
            ):
                return tok.start
        return None

    def _expr(self, query: str, mode: int, lineno: int, cond: bool, into: bool) -> None:
        at = self._find(query, lineno, into)
        if at is None or not query.strip():
            return
        try:
            if mode == 0:  # a whole statement
                src = _Src(query, self.at + at)
                _walk_statement(src, _tree(query), self.out, self.label)
                return
            if mode in (3, 4, 5):  # an assignment: the expression after := (or =)
                head = _Src(query, 0)
                eq = next((t for t in head.tokens if t.name in ("COLON_EQUALS", "ASCII_61")), None)
                if eq is None:
                    return
                rest = query[eq.stop :]
                skip = eq.stop + len(rest) - len(rest.lstrip())
                at, query = at + skip, rest.lstrip()
            elif mode != 2:
                return
            src = _Src("SELECT " + query, self.at + at, prefix=7)
            _walk_expression(src, _tree(src.text), cond, self.out, self.label)
        except pg.ParseError:
            return

    def _raise(self, body: dict[str, Any], lineno: int) -> None:
        if body.get("elog_level") != 21:  # ERROR: RAISE EXCEPTION (or a RAISE with no level)
            return
        if not any(k in body for k in ("message", "condname", "options")):
            return  # a bare RAISE; re-raises in a handler
        if lineno < 1 or lineno > len(self.lines):
            return
        toks = self.src.tokens
        first = next(
            (
                i
                for i, t in enumerate(toks)
                if t.start >= self.lines[lineno - 1]
                and self.text[t.start : t.stop].upper() == "RAISE"  # not an SQL keyword
            ),
            None,
        )
        if first is None:
            return
        semi = next((t for t in toks[first:] if t.name == "ASCII_59"), None)
        if semi is None:
            return
        start = toks[first].start
        message = body.get("message") or body.get("condname") or ""
        self.out.append(
            _Edit(
                self.at + start,
                self.at + semi.stop,
                "NULL;",
                "raise",
                f"{self.label}: RAISE EXCEPTION '{_one_line(message, 50)}' removed",
            )
        )


def _routine_body(stmt_text: str, at: int, as_loc: int) -> tuple[int, int] | None:
    """(start, end) in the file of a routine's $$-quoted body; ``as_loc``: its AS keyword."""
    for tok in _Src(stmt_text, at).tokens:
        if tok.start >= as_loc - at and tok.name == "SCONST":
            quoted = stmt_text[tok.start : tok.stop]
            m = re.match(r"\$\w*\$", quoted)
            if m is None:
                return None
            return at + tok.start + len(m.group()), at + tok.stop - len(m.group())
    return None


def _language(options: list[Any]) -> str:
    for opt in options:
        found = _node(opt)
        if found and found[1].get("defname") == "language":
            return (_sval(found[1].get("arg")) or "").lower()
    return ""


# ---- which objects are current ------------------------------------------------------------------


def _migrations(root: Path) -> list[Path]:
    return sorted(
        p for p in (root / MIGRATIONS).glob("*.sql") if not p.name.endswith(".rollback.sql")
    )


def _objects(stmt: Any) -> Iterator[tuple[str, str, Any]]:
    """(kind, name, node) of each mutable object a top-level migration statement defines."""
    found = _node(stmt)
    if found is None:
        return
    typ, body = found
    if typ == "CreateFunctionStmt":
        name = _sval(body.get("funcname", [None])[-1])
        if name:
            yield "routine", name, body
    elif typ == "CreateTrigStmt":
        yield "trigger", body.get("trigname", ""), body
    elif typ == "CreatePolicyStmt":
        yield "policy", body.get("policy_name", ""), body
    elif typ == "CreateStmt":
        yield from _table_checks(body)
    elif typ == "AlterTableStmt":
        table = body.get("relation", {}).get("relname", "")
        for cmd in body.get("cmds", []):
            c = _node(cmd)
            if c and c[1].get("subtype") == "AT_AddConstraint":
                con = _node(c[1].get("def"))
                if con and con[0] == "Constraint":
                    yield from _check(con[1], table)


def _table_checks(body: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    table = body.get("relation", {}).get("relname", "")
    for elt in body.get("tableElts", []):
        con = _node(elt)
        if con and con[0] == "Constraint":
            yield from _check(con[1], table)
        elif con and con[0] == "ColumnDef":
            for c in con[1].get("constraints", []):
                cc = _node(c)
                if cc and cc[0] == "Constraint":
                    yield from _check(cc[1], f"{table}_{con[1].get('colname', '')}")


def _check(body: dict[str, Any], owner: str) -> Iterator[tuple[str, str, Any]]:
    if body.get("contype") == "CONSTR_CHECK":
        yield "check", body.get("conname") or f"{owner}_check", body


def _drops(stmt: Any) -> Iterator[tuple[str, str]]:
    found = _node(stmt)
    if found is None:
        return
    typ, body = found
    if typ == "DropStmt":
        kind = {"OBJECT_TRIGGER": "trigger", "OBJECT_POLICY": "policy"}.get(
            body.get("removeType", ""), ""
        )
        kinds = {"OBJECT_FUNCTION": "routine", "OBJECT_PROCEDURE": "routine"}
        kind = kind or kinds.get(body.get("removeType", ""), "")
        for obj in body.get("objects", []):
            names = _node(obj)
            items = names[1].get("items", []) if names and names[0] == "List" else []
            if names and names[0] == "ObjectWithArgs":
                items = names[1].get("objname", [])
            if kind and items:
                yield kind, _sval(items[-1]) or ""
    elif typ == "AlterTableStmt":
        for cmd in body.get("cmds", []):
            c = _node(cmd)
            if c and c[1].get("subtype") == "AT_DropConstraint":
                yield "check", c[1].get("name", "")


def _current(root: Path) -> set[tuple[str, str, str, int]]:
    """(file, kind, name, statement index) of each object's current top-level definition."""
    last: dict[tuple[str, str], tuple[int, int]] = {}
    dropped: dict[tuple[str, str], tuple[int, int]] = {}
    files = _migrations(root)
    for f, path in enumerate(files):
        for s, stmt in enumerate(_tree(path.read_text(encoding="utf-8"))["stmts"]):
            for kind, name, _ in _objects(stmt["stmt"]):
                last[kind, name] = (f, s)
            for kind, name in _drops(stmt["stmt"]):
                dropped[kind, name] = (f, s)
    texts = [p.read_text(encoding="utf-8") for p in files]
    current: set[tuple[str, str, str, int]] = set()
    for (kind, name), (f, s) in last.items():
        if (kind, name) in dropped and dropped[kind, name] > (f, s):
            continue
        if kind == "routine" and any(
            m.group(1) == name for t in texts[f + 1 :] for m in _ROUTINE_TEXT.finditer(t)
        ):
            continue  # defined again later where the parser does not look (a DO block)
        current.add((files[f].name, kind, name, s))
    return current


# ---- tests --------------------------------------------------------------------------------------


class _Tests:
    """The tests of each unit, by the heuristic in the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules = {
            p: p.read_text(encoding="utf-8")
            for p in sorted((root / "agentdb").rglob("*.py"))
            if "tools" not in p.relative_to(root / "agentdb").parts
        }
        self.test_texts = {
            f"tests/{p.name}": p.read_text(encoding="utf-8")
            for p in sorted((root / "tests").glob("test_*.py"))
        }
        self.statement_files = {
            p.stem: p.read_text(encoding="utf-8")
            for p in sorted((root / "agentdb" / "queries").glob("*.sql"))
        }
        self._attack_ids: dict[str, list[str]] | None = None
        self._files: dict[str, tuple[str, ...]] = {}

    def _exists(self, target: str) -> bool:
        return (self.root / target).is_file()

    def _module_tests(self, stem: str) -> tuple[str, ...]:
        # The module's own file and the files _MODULE_TESTS names both: a module whose
        # behaviour is shown elsewhere (steps, by test_durable) keeps those tests when a
        # test file of its own name is added.
        own = f"tests/test_{stem.lstrip('_')}.py"
        mine = (own,) if self._exists(own) else ()
        return mine + tuple(t for t in _MODULE_TESTS.get(stem, ()) if t not in mine)

    def statement(self, name: str) -> tuple[str, ...]:
        quoted = f'"{name}"'
        found: list[str] = []
        for path, text in self.modules.items():
            if quoted in text:
                for t in self._module_tests(path.stem):
                    if t not in found:
                        found.append(t)
        found += [t for t in _STATEMENT_TESTS.get(name, ()) if t not in found]
        return tuple(found)

    @staticmethod
    def routed(name: str) -> tuple[str, ...]:
        if name.startswith("routing_"):
            return _CITUS_TESTS
        word = name.removeprefix("routed_").split("_")[0]
        return (_ROUTED_TESTS.get(word, _ROUTED_DEFAULT), FENCES)

    def attacks(self) -> dict[str, list[str]]:
        if self._attack_ids is None:
            from tests.test_attacks import CASES  # the cases' own ids, as pytest shows them

            ids: dict[str, list[str]] = {}
            for case in CASES:
                ids.setdefault(case.name, []).append(
                    f"{ATTACKS}::test_attack_is_refused[{case.id}]"
                )
            if len({i for v in ids.values() for i in v}) != len(CASES):
                ids = {name: [ATTACKS] for name in ids}  # duplicate ids: pytest renames them
            self._attack_ids = ids
        return self._attack_ids

    def _routine_files(self, name: str) -> tuple[str, ...]:
        """The test files of a routine: of the statements that call it, and those naming it."""
        if name in _ROUTINE_TESTS:
            return _ROUTINE_TESTS[name]
        if name not in self._files:
            call = re.compile(rf"\b{name}\(")
            files = [
                t
                for stem, text in self.statement_files.items()
                if call.search(text)
                for t in self._module_tests(stem)
            ]
            word = re.compile(rf"\b{name}\b")
            named = [
                t
                for t, text in self.test_texts.items()
                if t not in _NOT_BY_NAME and word.search(text)
            ]
            self._files[name] = tuple(files + (named if len(named) <= _MAX_BY_NAME else []))
        return self._files[name]

    def migration(self, names: Sequence[str], routines: Sequence[str]) -> tuple[str, ...]:
        """``names``: the object and all that call it; ``routines``: the routines among them."""
        targets: list[str] = []
        for obj in names:
            targets += [t for t in self.attacks().get(obj, []) if t not in targets]
        files = [f for name in routines for f in self._routine_files(name)]
        files += [f for name in names for f in _STATEMENT_TESTS.get(name, ())]
        if not targets and not files:
            targets = [ATTACKS]
        out = [*targets, FENCES]
        out += [f for f in dict.fromkeys(files) if f not in out]
        return tuple(out)


# ---- putting it together ------------------------------------------------------------------------


def _queries(root: Path, tests: _Tests) -> Iterator[tuple[_Unit, list[_Edit]]]:
    for folder in QUERY_DIRS:
        citus = "_citus" in folder
        for path in sorted((root / folder).glob("*.sql")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8")
            for name, at, sql in _statement_blocks(text):
                edits: list[_Edit] = []
                _walk_statement(_Src(sql, at), _tree(sql), edits, name)
                if name in _CITUS_STATEMENTS:
                    yield _Unit(rel, name, "statement", _CITUS_STATEMENTS[name], True), edits
                    continue
                targets = tests.routed(name) if citus else tests.statement(name)
                yield _Unit(rel, name, "statement", targets, citus), edits


def _calls(value: Any) -> Iterator[str]:
    """The functions an expression calls."""
    if isinstance(value, list):
        for v in value:
            yield from _calls(v)
    elif isinstance(value, dict):
        found = _node(value)
        if found and found[0] == "FuncCall":
            name = _sval(found[1].get("funcname", [None])[-1])
            if name:
                yield name
        for v in value.values():
            yield from _calls(v)


@dataclass(frozen=True, slots=True)
class _Object:
    path: str
    kind: str
    name: str
    body: dict[str, Any]
    span: tuple[int, int]  # its statement, in the file
    whole: _Src  # the file


def _users(objects: Sequence[_Object]) -> dict[str, set[str]]:
    """routine -> the objects that call it: routines (by their text), triggers (EXECUTE
    FUNCTION), CHECKs and policies (their expressions)."""
    routines = {o.name for o in objects if o.kind == "routine"}
    users: dict[str, set[str]] = {}
    for o in objects:
        if o.kind == "routine":
            text = o.whole.text[o.span[0] : o.span[1]]
            called = {r for r in routines if r != o.name and _call_of(r).search(text)}
        elif o.kind == "trigger":
            called = {_sval(o.body.get("funcname", [None])[-1]) or ""}
        else:
            called = set(_calls([o.body.get(k) for k in ("raw_expr", "qual", "with_check")]))
        for r in called:
            users.setdefault(r, set()).add(o.name)
    return users


def _call_of(name: str) -> re.Pattern[str]:
    """A call of routine ``name`` (not a GRANT or ALTER naming it: ``FUNCTION name(``)."""
    return re.compile(rf"(?<!FUNCTION )(?<!PROCEDURE )\b{name}\(", re.I)


def _closure(name: str, users: dict[str, set[str]]) -> list[str]:
    """Everything that calls ``name``, directly or through others, in a fixed order."""
    seen: list[str] = []
    todo = sorted(users.get(name, ()))
    while todo:
        n = todo.pop(0)
        if n != name and n not in seen:
            seen.append(n)
            todo += sorted(users.get(n, ()))
    return seen


def _migration_units(root: Path, tests: _Tests) -> Iterator[tuple[_Unit, list[_Edit]]]:
    current = _current(root)
    objects: list[_Object] = []
    for path in _migrations(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        whole = _Src(text, 0)
        for s, stmt in enumerate(_tree(text)["stmts"]):
            at = stmt.get("stmt_location", 0)
            span = (whole.char(at), whole.char(at + stmt["stmt_len"]))
            for kind, name, body in _objects(stmt["stmt"]):
                if (path.name, kind, name, s) in current:
                    objects.append(_Object(rel, kind, name, body, span, whole))
    users = _users(objects)
    kinds = {o.name: o.kind for o in objects}
    for o in objects:
        edits: list[_Edit] = []
        citus = o.kind == "routine" and o.name in _CITUS_ROUTINES
        if o.kind == "routine":
            _routine(o.whole, o.span, o.body, edits, o.name)
        else:
            walker = _Walker(o.whole, edits, o.name)
            for key in ("raw_expr", "whenClause", "qual", "with_check"):
                if key in o.body:
                    walker.walk(o.body[key], True, key)
        related = _closure(o.name, users)
        routines = [o.name] if o.kind == "routine" else []
        routines += [n for n in related if kinds.get(n) == "routine" and n not in _CITUS_ROUTINES]
        targets = _CITUS_TESTS if citus else tests.migration([o.name, *related], routines)
        if not citus and "check" in (o.kind, *(kinds.get(n) for n in related)):
            targets = (CHECK_EDGES, *targets)
        yield _Unit(o.path, o.name, o.kind, targets, citus), edits


def _routine(
    whole: _Src, span: tuple[int, int], body: dict[str, Any], out: list[_Edit], name: str
) -> None:
    text = whole.text
    stmt_text = text[span[0] : span[1]]
    options = body.get("options", [])
    as_loc = next(
        (
            whole.char(found[1].get("location", 0))
            for found in map(_node, options)
            if found and found[1].get("defname") == "as"
        ),
        None,
    )
    where = None if as_loc is None else _routine_body(stmt_text, span[0], as_loc)
    if where is None:
        return
    language = _language(options)
    if language == "sql":
        sql = text[where[0] : where[1]]
        _walk_statement(_Src(sql, where[0]), _tree(sql), out, name)
    elif language == "plpgsql":
        function = json.loads(pg.parse_plpgsql_json(stmt_text))[0]["PLpgSQL_function"]
        _Body(text, where[0], where[1], out, name).walk(function.get("action"))


def _tidy(text: str, edit: _Edit) -> _Edit:
    """A removed FOR UPDATE clause takes the blanks before it, or its whole line (what
    follows it on its line, a ``;`` say, joins the line before when that has no comment)."""
    if edit.op != "lock" or not text.startswith("FOR", edit.start):
        return edit
    line = text.rfind("\n", 0, edit.start) + 1
    eol = text.find("\n", edit.end)
    if eol >= 0 and not text[line : edit.start].strip():
        if not text[edit.end : eol].strip():
            return replace(edit, start=line, end=eol + 1)
        previous = text[text.rfind("\n", 0, max(line - 1, 0)) + 1 : line]
        if line > 0 and "--" not in previous:
            return replace(edit, start=line - 1)
    start = edit.start
    while start > line and text[start - 1] in " \t":
        start -= 1
    return replace(edit, start=start)


def _window(text: str, edit: _Edit) -> tuple[str, str] | None:
    """Whole lines around the edit, grown until they occur once in the file."""
    start = text.rfind("\n", 0, edit.start) + 1
    stop = text.find("\n", max(edit.end, edit.start + 1) - 1)
    stop = len(text) if stop < 0 else stop
    for grow in range(_MAX_WINDOW_LINES + 1):
        find = text[start:stop]
        if text.count(find) == 1:
            new = text[start : edit.start] + edit.replace + text[edit.end : stop]
            return find, new
        if grow % 2 == 0 and start > 0:
            start = text.rfind("\n", 0, start - 1) + 1
        elif stop < len(text):
            nxt = text.find("\n", stop + 1)
            stop = len(text) if nxt < 0 else nxt
        elif start > 0:
            start = text.rfind("\n", 0, start - 1) + 1
    return None


def read_equivalent(root: Path = ROOT) -> dict[str, str]:
    """The reviewed equivalent mutants: id -> reason."""
    path = root / EQUIVALENT_FILE
    found: dict[str, str] = {}
    if not path.exists():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        mid, _, reason = line.partition(":")
        found[mid.strip()] = reason.strip()
    return found


def _generate(root: Path) -> tuple[Generated, ...]:
    tests = _Tests(root)
    texts: dict[str, str] = {}
    seen: set[tuple[str, int, int, str]] = set()
    rows: list[tuple[_Unit, _Edit]] = []
    for unit, edits in [*_queries(root, tests), *_migration_units(root, tests)]:
        text = texts.setdefault(unit.path, (root / unit.path).read_text(encoding="utf-8"))
        ordered = sorted(edits, key=lambda e: (OPERATORS.index(e.op), e.start, e.end))
        for edit in (_tidy(text, e) for e in ordered):
            key = (unit.path, edit.start, edit.end, edit.replace)
            if key in seen or text[edit.start : edit.end] == edit.replace:
                continue
            seen.add(key)
            rows.append((unit, edit))
    rows.sort(key=lambda r: (r[0].path, r[0].name, OPERATORS.index(r[1].op), r[1].start, r[1].end))
    equivalent = read_equivalent(root)
    counters: dict[tuple[str, str, str], int] = {}
    out: list[Generated] = []
    for unit, edit in rows:
        window = _window(texts[unit.path], edit)
        if window is None:
            continue
        stem = Path(unit.path).stem
        n = counters[unit.path, unit.name, edit.op] = (
            counters.get((unit.path, unit.name, edit.op), 0) + 1
        )
        mid = f"gen-{stem}-{unit.name}-{edit.op}-{n}"
        find, new = window
        what = edit.what.replace(_LINE, _line_of(texts[unit.path], edit.start))
        mutant = Mutant(
            mid, unit.path, find, new, unit.tests, what, equivalent.get(mid, ""), unit.citus
        )
        out.append(Generated(mutant, edit.op, unit.name, unit.kind))
    return tuple(out)


@functools.cache
def generate(root: Path = ROOT) -> tuple[Generated, ...]:
    """Every generated mutant with its operator and object, in id order of the sources."""
    return _generate(root)


def generated_mutants(root: Path = ROOT) -> tuple[Mutant, ...]:
    return tuple(g.mutant for g in generate(root))


def sample(mutants: Sequence[Mutant], n: int, seed: int) -> list[Mutant]:
    """A deterministic sample of ``n`` of ``mutants`` (all when n >= len): same seed, same ids.

    Each mutant is ranked by a hash of the seed and its own id, and the ``n`` lowest
    are taken. So a change to one statement moves only that statement's mutants (their
    ids are numbered within it): the rest of the sample, which CI runs with the killers
    recorded for it, stays as it was. (Drawing ``n`` at random from the list would pick
    another sample whenever any mutant is added or removed.)
    """
    ordered = sorted(mutants, key=lambda m: m.id)
    if n >= len(ordered):
        return ordered

    def rank(m: Mutant) -> bytes:
        return hashlib.sha256(f"{seed}:{m.id}".encode()).digest()

    picked = {m.id for m in sorted(ordered, key=rank)[:n]}
    return [m for m in ordered if m.id in picked]
