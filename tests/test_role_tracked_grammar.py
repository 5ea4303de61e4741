"""SGLang's grammar object with the role track: tagged when read, consistent through every operation.

:class:`RoleTrackedGrammar` leaves ``accept_token`` to SGLang and tags the accepted tokens when its
roles are read. After any sequence of accepts, reads, rollbacks, re-tokenizations and termination,
its roles must equal a fresh track of the tokens the matcher holds, and SGLang's ``accepted_tokens``
must be those tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import xgrammar

from sglang_pask.srt.role_grammar import RoleTrackedGrammar
from sglang_pask.structure import RoleGrammar, TokenVocab
from sglang_pask.structure.roles import Role

REGEX = r'\[get_weather\(city="[A-Za-z ]+", days=[0-9]+\)(, get_time\(zone="[A-Za-z/]+"\))?\]'
REGEX_TEXT = '[get_weather(city="New York", days=3), get_time(zone="Europe/Paris")]'
# captures: roles come from the matcher when the track is read
SQL = """root ::= "SELECT " column " FROM " table
column[capture="arg_key"] ::= [a-z_]+
table[capture="func_name"] ::= [a-z_]+
"""
SQL_TEXT = "SELECT city_name FROM weather_stations"
CASES = {"regex": (REGEX, REGEX_TEXT), "ebnf": (SQL, SQL_TEXT)}


def _grammar(tok: Any, vocab: TokenVocab, compiler: Any, kind: str) -> tuple[RoleTrackedGrammar, RoleGrammar, list]:
    """A role-tracked SGLang grammar object of case ``kind``, its role grammar and the case's token ids."""
    key, text = CASES[kind]
    compiled = compiler.compile_regex(key) if kind == "regex" else compiler.compile_grammar(key)
    role_grammar = RoleGrammar.compile(kind, key, vocab)
    grammar = RoleTrackedGrammar(xgrammar.GrammarMatcher(compiled), len(tok), compiled, None, key,
                                 role_grammar=role_grammar)  # fmt: skip
    return grammar, role_grammar, tok.encode(text, add_special_tokens=False)


def _check(grammar: RoleTrackedGrammar, role_grammar: RoleGrammar, held: list[int]) -> list[int]:
    """The grammar holds ``held`` and its roles equal a fresh track of them; returns the roles."""
    assert grammar.accepted_tokens == held
    fresh = role_grammar.tracker(matcher=grammar.matcher)
    fresh.extend(held)
    roles = list(grammar.roles())
    assert roles == list(fresh.roles)
    assert len(roles) == len(held)
    return roles


@pytest.mark.parametrize("kind", sorted(CASES))
def test_roles_read_at_any_point_equal_a_fresh_track(tok, vocab, compiler, kind):
    grammar, role_grammar, ids = _grammar(tok, vocab, compiler, kind)
    assert len(ids) > 8
    for n, token in enumerate(ids, 1):
        grammar.accept_token(token)
        if n % 3 == 0:  # reads between accepts catch up on the tokens since the last read
            _check(grammar, role_grammar, ids[:n])
    roles = _check(grammar, role_grammar, ids)
    assert set(roles) - {int(Role.BOUNDARY), int(Role.WHITESPACE)}, "the grammar's own roles, not only syntax"


@pytest.mark.parametrize("kind", sorted(CASES))
def test_rollbacks_before_and_after_a_read(tok, vocab, compiler, kind):
    grammar, role_grammar, ids = _grammar(tok, vocab, compiler, kind)
    final = None
    for k in (1, 3, len(ids) // 2, len(ids)):
        for token in ids[len(grammar.accepted_tokens):]:
            grammar.accept_token(token)
        final = final or _check(grammar, role_grammar, ids)
        grammar.rollback(2)  # untagged: nothing read since
        for token in ids[-2:]:
            grammar.accept_token(token)
        grammar.rollback(k)  # into the tagged part
        _check(grammar, role_grammar, ids[: len(ids) - k])
    for token in ids[len(grammar.accepted_tokens):]:
        grammar.accept_token(token)
    assert _check(grammar, role_grammar, ids) == final


def test_rollback_of_zero_tokens_keeps_everything(tok, vocab, compiler):
    grammar, role_grammar, ids = _grammar(tok, vocab, compiler, "regex")
    for token in ids:
        grammar.accept_token(token)
    before = _check(grammar, role_grammar, ids)
    grammar.rollback(0)
    assert _check(grammar, role_grammar, ids) == before


def test_tokens_after_termination_are_neither_accepted_nor_tagged(tok, vocab, compiler):
    grammar, role_grammar, ids = _grammar(tok, vocab, compiler, "regex")
    for token in ids:
        grammar.accept_token(token)
    grammar.accept_token(tok.eos_token_id)
    assert grammar.is_terminated()
    grammar.accept_token(ids[0])  # SGLang ignores a token after termination
    roles = _check(grammar, role_grammar, ids + [tok.eos_token_id])
    assert roles[-1] == Role.TEMPLATE
    grammar.rollback(1)
    assert not grammar.is_terminated()
    _check(grammar, role_grammar, ids)


def test_jump_and_retokenize_replaces_the_changed_tail(tok, vocab, compiler):
    grammar, role_grammar, ids = _grammar(tok, vocab, compiler, "regex")
    text = CASES["regex"][1]
    for token in ids:
        grammar.accept_token(token)
    _check(grammar, role_grammar, ids)
    tail = 6
    old = ids[-tail:]
    # the same text, one token per character (every ASCII character is a token of a byte-level BPE)
    chars = tok.decode(old)
    new = [tok.convert_tokens_to_ids(c) for c in chars]
    assert new != old and tok.decode(new) == chars and chars == text[-len(chars):]
    grammar.jump_and_retokenize(old, new, next_state=0)
    _check(grammar, role_grammar, ids[:-tail] + new)
