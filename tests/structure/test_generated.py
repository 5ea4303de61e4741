"""Generated-token roles: hand-written goldens checked token by token, run in lockstep with xgrammar.

Every golden is tokenized with a real byte-level BPE tokenizer, fed to a real xgrammar
``GrammarMatcher`` compiled from the same grammar (so the sequence is grammar-accepted) and to the
role tracker; the tracker's roles must equal the golden's, token by token. Rollback is checked in
lockstep with the matcher: after ``rollback(k)`` the track equals the track it had ``k`` tokens
earlier, and re-accepting restores the full track.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import xgrammar  # noqa: E402
from golden_markup import expected_token_roles, parse_markup

from sglang_pask.structure.roles import LABELS, Role
from sglang_pask.structure.tracker import RoleGrammar, RoleTracker
from sglang_pask.structure.vocab import TokenVocab, hf_special_ids

# --------------------------------------------------------------------------------------- goldens
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "locale": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "alerts": {"type": "boolean"},
                "note": {"type": ["string", "null"]},
            },
            "required": ["location", "days"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}


def tool_choice_required_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The schema SGLang builds for ``tool_choice="required"`` (an array of call envelopes)."""
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": t["function"]["parameters"],
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ],
        },
    }


# "locale" shares its first letters with the required "location": its tokens are first tagged
# required and revised to ARG_KEY at the closing quote.
JSON_CALL = (
    '[{"⟦B|name⟧": "⟦F|get_weather⟧", "⟦B|parameters⟧": {"⟦R|location⟧": "⟦S|San Francisco⟧", '
    '"⟦A|locale⟧": "⟦S|fr-CH, Zürich 東京⟧", "⟦A|unit⟧": "⟦E|celsius⟧", "⟦R|days⟧": ⟦N|3⟧, "⟦A|alerts⟧": ⟦L|true⟧, '
    '"⟦A|note⟧": ⟦Z|null⟧}}, {"⟦B|name⟧": "⟦F|get_time⟧", "⟦B|parameters⟧": {"⟦R|timezone⟧": '
    '"⟦S|Europe/Paris⟧"}}]'
)

# BFCL-style Python call list; the regex spells out functions, keyword arguments (optional ones in
# optional groups) and enum choices, as a BFCL harness would.
_AREA = r'calculate_triangle_area\(base=-?\d+, height=-?\d+(, unit=("units"|"cm"))?(, exact=(True|False))?\)'
_FACT = r"math\.factorial\(number=-?\d+\)"
BFCL_REGEX = rf"\[({_AREA}|{_FACT})(, ({_AREA}|{_FACT}))*\]"
BFCL_CALL = (
    '[⟦F|calculate_triangle_area⟧(⟦R|base⟧=⟦N|10⟧, ⟦R|height⟧=⟦N|-5⟧, ⟦A|unit⟧="⟦E|units⟧", '
    "⟦A|exact⟧=⟦L|True⟧), ⟦F|math.factorial⟧(⟦R|number⟧=⟦N|5⟧)]"
)

# The BFCL harness sends EBNF: one rule per function (its name and the opening parenthesis as one
# literal), one per parameter-name set, shared value rules. Which arguments are required and which
# have enums comes from the function docs (found in the prompt).
BFCL_EBNF = r"""root ::= "[" call ("," " "? call)* "]"
call ::= fn_0 | fn_1
fn_0 ::= "calculate_triangle_area(" (key_0 "=" value ("," " "? key_0 "=" value)*)? ")"
key_0 ::= "base" | "height" | "unit"
fn_1 ::= "plan_trip(" (key_1 "=" value ("," " "? key_1 "=" value)*)? ")"
key_1 ::= "cities" | "options" | "note"
value ::= string | number | "True" | "False" | "None" | list | dict
list ::= "[" (value ("," " "? value)*)? "]"
dict ::= "{" (pair ("," " "? pair)*)? "}"
pair ::= string ":" " "? value
string ::= ("\"" ([^"\\\n] | "\\" [^\n])* "\"") | ("'" ([^'\\\n] | "\\" [^\n])* "'")
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
"""
BFCL_DOCS = [
    {
        "name": "calculate_triangle_area",
        "description": "Area of a triangle.",
        "parameters": {
            "type": "dict",
            "properties": {
                "base": {"type": "integer"},
                "height": {"type": "integer"},
                "unit": {"type": "string", "enum": ["units", "cm"]},
            },
            "required": ["base", "height"],
        },
    },
    {
        "name": "plan_trip",
        "description": "Plan a trip.",
        "parameters": {
            "type": "dict",
            "properties": {"cities": {"type": "array"}, "options": {"type": "dict"}, "note": {"type": "string"}},
            "required": ["cities"],
        },
    },
]
BFCL_EBNF_CALL = (
    "[⟦F|calculate_triangle_area⟧(⟦R|base⟧=⟦N|10⟧, ⟦R|height⟧=⟦N|5⟧, ⟦A|unit⟧='⟦E|cm⟧'), "
    '⟦F|plan_trip⟧(⟦R|cities⟧=["⟦S|Paris⟧", "⟦S|Rome⟧"], ⟦A|options⟧={"⟦A|budget⟧": ⟦N|1200.5⟧, '
    '"⟦A|fast⟧": ⟦L|True⟧}, ⟦A|note⟧=⟦Z|None⟧)]'
)

SQL_EBNF = r"""root ::= "SELECT " columns " FROM " table where?
columns ::= column (", " column)*
column[capture="arg_key"] ::= [a-z_]+
table[capture="func_name"] ::= [a-z_]+
where ::= " WHERE " column " " op " " value (" AND " column " " op " " value)*
op ::= "=" | ">" | "<"
value ::= number | string
number[capture="value_number"] ::= [0-9]+
string[capture="value_string"] ::= "'" [^']* "'"
"""
SQL_QUERY = "⟦B|SELECT⟧ ⟦A|name⟧, ⟦A|age⟧ ⟦B|FROM⟧ ⟦F|users⟧ ⟦B|WHERE⟧ ⟦A|age⟧ > ⟦N|30⟧ ⟦B|AND⟧ ⟦A|name⟧ = ⟦S|'bob o'⟧"
# The same query without capture annotations: only the lexer speaks.
SQL_QUERY_LEXER = (
    "⟦B|SELECT⟧ ⟦T|name⟧, ⟦T|age⟧ ⟦B|FROM⟧ ⟦T|users⟧ ⟦B|WHERE⟧ ⟦T|age⟧ > ⟦N|30⟧ ⟦B|AND⟧ ⟦T|name⟧ = '⟦S|bob o⟧'"
)


def _compile(compiler: Any, kind: str, key: str) -> Any:
    if kind == "json":
        return compiler.compile_json_schema(key)
    if kind == "regex":
        return compiler.compile_regex(key)
    return compiler.compile_grammar(key)


def _table(tok: Any, ids: list[int], got: list[int], want: list[int]) -> str:
    rows = [f"{tok.decode([i])!r:>16} {LABELS[g]:>14} {LABELS[w]:>14}{'' if g == w else '  <-- differs'}"
            for i, g, w in zip(ids, got, want)]  # fmt: skip
    return "\n".join([f"{'token':>16} {'got':>14} {'want':>14}", *rows])


# name: (grammar kind, grammar, golden markup, function docs or None)
CASES = {
    "json_function_call": ("json", json.dumps(tool_choice_required_schema([WEATHER, TIME])), JSON_CALL, None),
    "bfcl_regex_call": ("regex", BFCL_REGEX, BFCL_CALL, None),
    "bfcl_ebnf_call": ("ebnf", BFCL_EBNF, BFCL_EBNF_CALL, BFCL_DOCS),
    "sql_ebnf_captures": ("ebnf", SQL_EBNF, SQL_QUERY, None),
    "sql_ebnf_lexer": ("ebnf", re.sub(r'\[capture="[^"]*"\]', "", SQL_EBNF), SQL_QUERY_LEXER, None),
}


def _run(tok: Any, vocab: Any, compiler: Any, encode: Any, case: str, per_char: bool = False):
    kind, key, markup, functions = CASES[case]
    text, char_roles = parse_markup(markup)
    if per_char:  # one token per character (or per byte): token roles must equal the character roles
        ids, offsets = [], []
        for i, c in enumerate(text):
            pieces = tok.convert_tokens_to_ids(tok.tokenize(c))
            ids.extend(pieces)
            offsets.extend([(i, i + 1)] * len(pieces))
    else:
        ids, offsets = encode(text)
    matcher = xgrammar.GrammarMatcher(_compile(compiler, kind, key))
    tracker = RoleGrammar.compile(kind, key, vocab, functions=functions).tracker(matcher)
    snapshots = [list(tracker.roles)]
    for t in ids:
        assert matcher.accept_token(t), f"grammar rejected {tok.decode([t])!r}"
        tracker.accept(t)
        snapshots.append(list(tracker.roles))
    want = expected_token_roles(char_roles, offsets)
    assert list(tracker.roles) == want, _table(tok, ids, list(tracker.roles), want)
    return ids, matcher, tracker, snapshots


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_token_by_token(tok, vocab, compiler, encode, case):
    _, matcher, tracker, _ = _run(tok, vocab, compiler, encode, case)
    assert matcher.accept_token(tok.eos_token_id) and matcher.is_terminated()
    assert tracker.accept(tok.eos_token_id) == Role.TEMPLATE


@pytest.mark.real_model
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_token_by_token_with_the_default_model_tokenizer(qwen_tok, case):
    info = xgrammar.TokenizerInfo.from_huggingface(qwen_tok, vocab_size=len(qwen_tok))
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = qwen_tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]

    _run(qwen_tok, TokenVocab.from_xgrammar(info, hf_special_ids(qwen_tok)), compiler, encode, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_one_token_per_character(tok, vocab, compiler, encode, case):
    _run(tok, vocab, compiler, encode, case, per_char=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_goldens_have_tokens_that_cross_role_boundaries(encode, case):
    text, char_roles = parse_markup(CASES[case][2])
    _, offsets = encode(text)
    crossing = [text[s:e] for s, e in offsets if len(set(char_roles[s:e])) > 1]
    assert crossing, "the golden should exercise the token-boundary rule"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rollback_in_lockstep_with_matcher(tok, vocab, compiler, encode, case):
    ids, matcher, tracker, snapshots = _run(tok, vocab, compiler, encode, case)
    final = snapshots[-1]
    n = len(ids)
    for k in sorted({1, 2, 3, 4, 5, 7, n // 3, n // 2, n - 1, n}):
        matcher.rollback(k)
        tracker.rollback(k)
        assert list(tracker.roles) == snapshots[n - k], f"after rollback({k})"
        for t in ids[n - k :]:
            assert matcher.accept_token(t)
            tracker.accept(t)
        assert list(tracker.roles) == final, f"after rollback({k}) and re-accept"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rollback_step_by_step_and_partial_replay(tok, vocab, compiler, encode, case):
    ids, matcher, tracker, snapshots = _run(tok, vocab, compiler, encode, case)
    n = len(ids)
    for j in range(n, 0, -1):  # peel one token at a time
        matcher.rollback(1)
        tracker.rollback(1)
        assert list(tracker.roles) == snapshots[j - 1]
    for j, t in enumerate(ids):  # and forward again, tracking every prefix
        assert matcher.accept_token(t)
        tracker.accept(t)
        assert list(tracker.roles) == snapshots[j + 1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_extend_in_chunks_equals_accept_per_token(tok, vocab, compiler, encode, case):
    ids, _, _, snapshots = _run(tok, vocab, compiler, encode, case)
    kind, key, _, functions = CASES[case]
    for chunk in (1, 4, len(ids)):
        matcher = xgrammar.GrammarMatcher(_compile(compiler, kind, key))  # captures are read from it
        tracker = RoleGrammar.compile(kind, key, vocab, functions=functions).tracker(matcher)
        for start in range(0, len(ids), chunk):
            assert all(matcher.accept_token(t) for t in ids[start : start + chunk])
            tracker.extend(ids[start : start + chunk])
            assert list(tracker.roles) == snapshots[min(start + chunk, len(ids))], f"chunks of {chunk}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_copy_forks_with_the_matcher(tok, vocab, compiler, encode, case):
    ids, matcher, tracker, snapshots = _run(tok, vocab, compiler, encode, case)
    half = len(ids) // 2
    matcher.rollback(len(ids) - half)
    tracker.rollback(len(ids) - half)
    fork = matcher.fork()
    other = tracker.copy(matcher=fork)
    for t in ids[half:]:
        assert fork.accept_token(t)
        other.accept(t)
    assert list(other.roles) == snapshots[-1]
    assert list(tracker.roles) == snapshots[half]


def test_revision_of_a_key_that_shares_a_required_prefix(tok, vocab, compiler, encode):
    _, _, tracker, snapshots = _run(tok, vocab, compiler, encode, "json_function_call")
    # some snapshot had a token of "locale" tagged REQUIRED_KEY that the final track has as ARG_KEY
    final = snapshots[-1]
    revised = [
        i for snap in snapshots for i, r in enumerate(snap) if r == Role.REQUIRED_KEY and final[i] == Role.ARG_KEY
    ]
    assert revised
    assert tracker.revised_from <= min(revised)


def test_memo_serves_later_requests(tok, vocab, encode):
    kind, key, markup, _ = CASES["json_function_call"]
    grammar = RoleGrammar.compile(kind, key, vocab)
    ids, _ = encode(parse_markup(markup)[0])
    first = grammar.tracker()
    for t in ids:
        first.accept(t)
    size = len(grammar.memo)
    second = grammar.tracker()
    for t in ids:
        second.accept(t)
    assert list(second.roles) == list(first.roles)
    assert len(grammar.memo) == size


def test_function_docs_refine_a_generic_call_regex(vocab, encode):
    generic = r'\[[a-z_.]+\((\w+=("[^"]*"|-?\d+)(, )?)*\)\]'
    ids, _ = encode('[get_weather(location="Paris", days=2)]')
    plain = RoleTracker.for_grammar("regex", generic, vocab)
    informed = RoleTracker.for_grammar("regex", generic, vocab, functions=[WEATHER])
    for t in ids:
        plain.accept(t)
        informed.accept(t)
    assert Role.REQUIRED_KEY not in plain.roles and Role.FUNC_NAME in plain.roles
    assert Role.REQUIRED_KEY in informed.roles


@pytest.mark.parametrize(
    ("kind", "key", "message"),
    [
        ("json", "{not json", "not valid JSON"),
        ("json", "[1, 2]", "must be an object"),
        ("json", '{"$ref": "http://x/y"}', r"local \$ref"),
        ("json", '{"properties": {"a": {"$ref": "#/$defs/missing"}}, "required": "a"}', "'required' must be"),
        ("regex", "[a-", "regex does not parse"),
        ("sql", "SELECT", "unknown grammar kind"),
    ],
)
def test_malformed_grammars_raise_clear_errors(vocab, kind, key, message):
    with pytest.raises(ValueError, match=message):
        RoleGrammar.compile(kind, key, vocab)


def test_capture_grammar_needs_a_matcher(vocab):
    grammar = RoleGrammar.compile("ebnf", SQL_EBNF, vocab)
    with pytest.raises(ValueError, match="GrammarMatcher"):
        grammar.tracker()


def test_rollback_past_the_start_raises(vocab):
    tracker = RoleTracker.for_grammar("text", "", vocab)
    with pytest.raises(ValueError, match="cannot roll back"):
        tracker.rollback(1)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_grammar_walks_keep_the_track_consistent(tok, vocab, compiler, case, seed):
    """Random outputs the grammar allows (escapes, odd whitespace, unicode): no errors, exact rollback."""
    import random

    import torch

    kind, key, _, functions = CASES[case]
    rng = random.Random(seed)
    matcher = xgrammar.GrammarMatcher(_compile(compiler, kind, key))
    tracker = RoleGrammar.compile(kind, key, vocab, functions=functions).tracker(matcher)
    bitmask = xgrammar.allocate_token_bitmask(1, len(vocab))
    bits = torch.arange(32, dtype=torch.int32)
    ids: list[int] = []
    snapshots = [[]]
    while len(ids) < 80 and not matcher.is_terminated():
        matcher.fill_next_token_bitmask(bitmask)
        allowed = ((bitmask[0].unsqueeze(-1) >> bits) & 1).flatten()[: len(vocab)].nonzero().flatten().tolist()
        content = [t for t in allowed if t not in vocab.special_ids and vocab.token_bytes[t].strip()]
        allowed = content if content and rng.random() < 0.9 else allowed
        t = rng.choice(allowed)
        assert matcher.accept_token(t)
        tracker.accept(t)
        ids.append(t)
        snapshots.append(list(tracker.roles))
        assert len(tracker.roles) == len(ids)
    n = len(ids)
    for k in sorted({1, 3, n // 2, n}):
        matcher.rollback(k)
        tracker.rollback(k)
        assert list(tracker.roles) == snapshots[n - k]
        for t in ids[n - k :]:
            assert matcher.accept_token(t)
            tracker.accept(t)
        assert list(tracker.roles) == snapshots[-1]


@pytest.mark.parametrize("case", ["json_function_call", "bfcl_ebnf_call", "sql_ebnf_captures"])
def test_jump_forward_and_retokenize_keep_the_track_consistent(tok, vocab, compiler, encode, case):
    """SGLang's jump-forward: append the forced string, retokenize, roll back to the common prefix."""
    kind, key, markup, functions = CASES[case]
    ids, _ = encode(parse_markup(markup)[0])
    grammar = RoleGrammar.compile(kind, key, vocab, functions=functions)
    compiled = _compile(compiler, kind, key)
    jumped = 0
    for cut in range(1, len(ids)):
        matcher = xgrammar.GrammarMatcher(compiled)
        tracker = grammar.tracker(matcher)
        for t in ids[:cut]:
            assert matcher.accept_token(t)
            tracker.accept(t)
        forced = matcher.find_jump_forward_string()
        if not forced:
            continue
        jumped += 1
        new_ids, _ = encode(tok.decode(ids[:cut]) + forced)
        common = next((i for i, (a, b) in enumerate(zip(ids[:cut], new_ids)) if a != b), min(cut, len(new_ids)))
        matcher.rollback(cut - common)
        tracker.rollback(cut - common)
        for t in new_ids[common:]:
            assert matcher.accept_token(t)
            tracker.accept(t)
        replay = xgrammar.GrammarMatcher(compiled)
        fresh = grammar.tracker(replay)
        for t in new_ids:
            assert replay.accept_token(t)
            fresh.accept(t)
        assert list(tracker.roles) == list(fresh.roles), f"jump-forward after {cut} tokens: {forced!r}"
    assert jumped
