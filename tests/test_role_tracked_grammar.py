"""SGLang's grammar object with the role track: tagged when read, consistent through every operation.

:class:`RoleTrackedGrammar` leaves ``accept_token`` to SGLang and tags the accepted tokens when its
roles are read. After any sequence of accepts, reads, rollbacks, re-tokenizations and termination,
its roles must equal a fresh track of the tokens the matcher holds, and SGLang's ``accepted_tokens``
must be those tokens. Wrapped by SGLang's reasoning parser, the grammar's roles stand after the
thinking, in the response and in the roles PASK reads.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import xgrammar
from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarObject

from sglang_pask.srt import roles as srt_roles
from sglang_pask.srt.grammar import RoleTrackedGrammar, request_grammar_roles
from sglang_pask.srt.output import output_role_labels
from sglang_pask.structure import RoleGrammar, TokenVocab
from sglang_pask.structure.roles import LABELS, Role

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
        for token in ids[len(grammar.accepted_tokens) :]:
            grammar.accept_token(token)
        final = final or _check(grammar, role_grammar, ids)
        grammar.rollback(2)  # untagged: nothing read since
        for token in ids[-2:]:
            grammar.accept_token(token)
        grammar.rollback(k)  # into the tagged part
        _check(grammar, role_grammar, ids[: len(ids) - k])
    for token in ids[len(grammar.accepted_tokens) :]:
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
    assert new != old and tok.decode(new) == chars and chars == text[-len(chars) :]
    grammar.jump_and_retokenize(old, new, next_state=0)
    _check(grammar, role_grammar, ids[:-tail] + new)


def _reasoning_request(tok: Any, vocab: TokenVocab, compiler: Any) -> tuple[Any, RoleTrackedGrammar, int]:
    """A request whose regex grammar SGLang's reasoning parser wrapped, after its thinking and its answer."""
    grammar, _, ids = _grammar(tok, vocab, compiler, "regex")
    thinking = tok.encode("<think>Which city, and how many days?", add_special_tokens=False)
    think_end = tok.encode("</think>", add_special_tokens=False)
    wrapper = ReasonerGrammarObject(grammar, think_end_ids=think_end)
    wrapper.maybe_init_reasoning(True)
    output = thinking + think_end + ids
    for token in output:
        wrapper.accept_token(token)
    assert grammar.accepted_tokens == ids  # the grammar saw the answer only
    return (
        SimpleNamespace(output_ids=output, grammar=wrapper, origin_input_ids=thinking[:5]),
        grammar,
        len(output) - len(ids),
    )


def test_a_reasoning_models_grammar_roles_stand_after_its_thinking(tok, vocab, compiler):
    req, grammar, answer_start = _reasoning_request(tok, vocab, compiler)
    offset, roles = request_grammar_roles(req)
    assert (
        offset == answer_start and list(roles) == list(grammar.roles()) and len(roles) == len(req.output_ids) - offset
    )
    req.output_ids = req.output_ids + [req.output_ids[-1]]  # sampled, not yet accepted
    assert request_grammar_roles(req) == (answer_start, roles)
    req.output_ids = req.output_ids[:-1]
    labels = output_role_labels(req, vocab)
    assert len(labels) == len(req.output_ids)
    assert labels[offset:] == [LABELS[r] for r in roles]
    assert not set(labels[:offset]) & {"func_name", "arg_key", "required_key"}  # the thinking is lexed as text


def test_request_roles_put_a_reasoning_answer_after_the_thinking(tok, vocab, compiler, monkeypatch):
    req, grammar, answer_start = _reasoning_request(tok, vocab, compiler)
    monkeypatch.setattr(srt_roles, "process_vocab", lambda: vocab)
    table = srt_roles.RequestRoles()
    table.requests[0] = req
    prompt = len(req.origin_input_ids)
    positions = torch.arange(prompt + len(req.output_ids))
    roles = table.roles_of(0, positions).tolist()
    assert roles[prompt + answer_start :] == list(grammar.roles())
    assert set(roles[prompt : prompt + answer_start]) == {int(Role.FREE_TEXT)}


def test_grammar_roles_that_do_not_match_the_output_are_not_placed(tok, vocab, compiler):
    req, _, _ = _reasoning_request(tok, vocab, compiler)
    req.output_ids = req.output_ids[:-4] + [req.output_ids[0]] * 4
    assert request_grammar_roles(req) == (0, [])
    grammar, _, ids = _grammar(tok, vocab, compiler, "regex")
    for token in ids:
        grammar.accept_token(token)
    plain = SimpleNamespace(output_ids=ids, grammar=grammar)
    assert request_grammar_roles(plain) == (0, list(grammar.roles()))
    assert request_grammar_roles(SimpleNamespace(output_ids=ids, grammar=None)) == (0, [])
