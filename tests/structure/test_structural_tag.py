"""Structural-tag roles (SGLang's OpenAI tools path with a tool-call parser), checked token by token.

The structural tags are built as SGLang 0.5.23 builds them (``FunctionCallParser(tools, "qwen25")
.get_structure_constraint(...)`` with strict tools gives the legacy form below, serialized with
``model_dump(by_alias=True)``) and compiled into a real xgrammar matcher the way SGLang's
``XGrammarGrammarBackend.dispatch_structural_tag`` compiles them. Every golden runs in lockstep with
that matcher, and rollback must restore the earlier tracks exactly.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import xgrammar  # noqa: E402
from golden_markup import expected_token_roles, parse_markup
from xgrammar.structural_tag import StructuralTag, StructuralTagItem  # noqa: E402

from sglang_pask.structure.roles import LABELS, Role
from sglang_pask.structure.tag_roles import literal_roles
from sglang_pask.structure.tracker import RoleGrammar
from sglang_pask.structure.vocab import TokenVocab, hf_special_ids

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "locale": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "alerts": {"type": "boolean"},
        },
        "required": ["location", "days"],
    },
}
TIME = {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
}


def qwen25_structural_tag(functions: list[dict[str, Any]], at_least_one: bool) -> str:
    """SGLang's legacy structural tag for the qwen25 parser (``at_least_one``: tool_choice required)."""
    structures = [
        {
            "begin": f'<tool_call>\n{{"name":"{f["name"]}", "arguments":',
            "schema": f["parameters"],
            "end": "}\n</tool_call>",
        }
        for f in functions
    ]
    tag = {
        "type": "structural_tag",
        "structures": structures,
        "triggers": ["<tool_call>"],
        "at_least_one": at_least_one,
    }
    return json.dumps(tag)


def compile_like_sglang(compiler: Any, key_string: str) -> Any:
    """``dispatch_structural_tag`` of SGLang's xgrammar backend."""
    tag = json.loads(key_string)
    if tag.get("structures") is None:
        return compiler.compile_structural_tag(key_string)
    items = [
        StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"]) for s in tag["structures"]
    ]
    new_tag = StructuralTag.from_legacy_structural_tag(items, tag["triggers"])
    new_tag.format.at_least_one = tag.get("at_least_one", False)
    return compiler.compile_structural_tag(new_tag)


# tool_choice "auto" with strict tools: free text, then calls. "locale" shares its start with the
# required "location".
AUTO_CALLS = (
    "⟦T|Let⟧ ⟦T|me⟧ ⟦T|check⟧ ⟦T|both.⟧\n⟦P|<tool_call>⟧\n"
    '{"name":"⟦F|get_weather⟧", "arguments":{"⟦R|location⟧": "⟦S|San Francisco⟧", "⟦A|locale⟧": "⟦S|en-US⟧", '
    '"⟦A|unit⟧": "⟦E|celsius⟧", "⟦R|days⟧": ⟦N|3⟧, "⟦A|alerts⟧": ⟦L|false⟧}}\n⟦P|</tool_call>⟧\n'
    '⟦P|<tool_call>⟧\n{"name":"⟦F|get_time⟧", "arguments":{"⟦R|timezone⟧": "⟦S|Europe/Paris⟧"}}\n⟦P|</tool_call>⟧'
)
# tool_choice "required": the output starts with a call; a number ends right before the tag's end.
REQUIRED_CALLS = (
    '⟦P|<tool_call>⟧\n{"name":"⟦F|get_weather⟧", "arguments":{"⟦R|location⟧":"⟦S|Zürich 東京⟧","⟦R|days⟧":⟦N|14⟧}}'
    "\n⟦P|</tool_call>⟧"
)
# A model-native tag in the newer form (the shape xgrammar builds for DeepSeek-R1, tool_choice
# required): a tag around calls joined by a separator, each call's begin naming its function.
_DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
NATIVE_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<｜tool▁calls▁begin｜>",
        "content": {
            "type": "tags_with_separator",
            "tags": [
                {
                    "type": "tag",
                    "begin": f'<invoke name="{f["name"]}">\n```json\n',
                    "content": {"type": "json_schema", "json_schema": f["parameters"], "style": "json"},
                    "end": "\n```<｜tool▁call▁end｜>",
                }
                for f in (WEATHER, TIME)
            ],
            "separator": "\n",
            "at_least_one": True,
        },
        "end": "<｜tool▁calls▁end｜>",
    },
}
NATIVE_CALLS = (
    '⟦P|<｜tool▁calls▁begin｜><invoke name="⟧⟦F|get_time⟧⟦P|">⟧\n⟦P|```json⟧\n'
    '{"⟦R|timezone⟧": "⟦S|UTC⟧"}\n⟦P|```<｜tool▁call▁end｜>⟧\n'
    '⟦P|<invoke name="⟧⟦F|get_weather⟧⟦P|">⟧\n⟦P|```json⟧\n{"⟦R|location⟧": "⟦S|Oslo⟧", "⟦R|days⟧": ⟦N|2⟧}'
    "\n⟦P|```<｜tool▁call▁end｜><｜tool▁calls▁end｜>⟧"
)
# any_text inside a tag: free text up to the tag's end.
TEXT_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
            {"type": "const_string", "value": "\n"},
            {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
                {"type": "tag", "begin": '<tool_call>{"name": "get_time", "arguments": ',
                 "content": {"type": "json_schema", "json_schema": TIME["parameters"]}, "end": "}</tool_call>"}
            ]},
        ],
    },
}  # fmt: skip
TEXT_CALLS = (
    "⟦P|<think>⟧⟦T|a<b>⟧ ⟦T|c</thin⟧⟦P|</think>⟧\n⟦T|Time:⟧ ⟦T|<tool_⟧ ⟦T|no.⟧ "
    '⟦P|<tool_call>⟧{"name": "⟦F|get_time⟧", "arguments": {"⟦R|timezone⟧": "⟦S|UTC⟧"}}⟦P|</tool_call>⟧'
)

CASES = {
    "qwen25_auto": (qwen25_structural_tag([WEATHER, TIME], at_least_one=False), AUTO_CALLS),
    "qwen25_required": (qwen25_structural_tag([WEATHER, TIME], at_least_one=True), REQUIRED_CALLS),
    "native_tags_with_separator": (json.dumps(NATIVE_TAG), NATIVE_CALLS),
    "any_text_and_triggers": (json.dumps(TEXT_TAG), TEXT_CALLS),
}


def _table(tok: Any, ids: list[int], got: list[int], want: list[int]) -> str:
    rows = [f"{tok.decode([i])!r:>24} {LABELS[g]:>14} {LABELS[w]:>14}{'' if g == w else '  <-- differs'}"
            for i, g, w in zip(ids, got, want)]  # fmt: skip
    return "\n".join(rows)


def _run(tok: Any, vocab: TokenVocab, compiler: Any, case: str, per_char: bool = False):
    key, markup = CASES[case]
    text, char_roles = parse_markup(markup)
    if per_char:
        ids, offsets = [], []
        for i, c in enumerate(text):
            pieces = tok.convert_tokens_to_ids(tok.tokenize(c))
            ids.extend(pieces)
            offsets.extend([(i, i + 1)] * len(pieces))
    else:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
    matcher = xgrammar.GrammarMatcher(compile_like_sglang(compiler, key))
    tracker = RoleGrammar.compile("structural_tag", key, vocab).tracker(matcher)
    snapshots = [list(tracker.roles)]
    for t in ids:
        assert matcher.accept_token(t), f"grammar rejected {tok.decode([t])!r}"
        tracker.accept(t)
        snapshots.append(list(tracker.roles))
    want = expected_token_roles(char_roles, offsets)
    assert list(tracker.roles) == want, _table(tok, ids, list(tracker.roles), want)
    return ids, matcher, tracker, snapshots


def _check_rollback(ids: list[int], matcher: Any, tracker: Any, snapshots: list[list[int]]) -> None:
    n = len(ids)
    for k in sorted({1, 2, 3, 5, n // 3, n // 2, n - 1, n}):
        matcher.rollback(k)
        tracker.rollback(k)
        assert list(tracker.roles) == snapshots[n - k], f"after rollback({k})"
        for t in ids[n - k :]:
            assert matcher.accept_token(t)
            tracker.accept(t)
        assert list(tracker.roles) == snapshots[-1], f"after rollback({k}) and re-accept"
    for j in range(n, 0, -1):
        matcher.rollback(1)
        tracker.rollback(1)
        assert list(tracker.roles) == snapshots[j - 1]
    for j, t in enumerate(ids):  # and forward again, tracking every prefix
        assert matcher.accept_token(t)
        tracker.accept(t)
        assert list(tracker.roles) == snapshots[j + 1]


@pytest.fixture(scope="module")
def qwen(qwen_tok: Any) -> tuple[Any, TokenVocab, Any]:
    info = xgrammar.TokenizerInfo.from_huggingface(qwen_tok, vocab_size=len(qwen_tok))
    return (
        qwen_tok,
        TokenVocab.from_xgrammar(info, hf_special_ids(qwen_tok)),
        xgrammar.GrammarCompiler(info, max_threads=1),
    )


@pytest.mark.real_model
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_with_the_default_model_tokenizer_in_lockstep(qwen, case):
    tok, vocab, compiler = qwen
    ids, matcher, tracker, snapshots = _run(tok, vocab, compiler, case)
    _check_rollback(ids, matcher, tracker, snapshots)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("per_char", [False, True])
def test_golden_with_the_toy_tokenizer_in_lockstep(tok, vocab, compiler, case, per_char):
    ids, matcher, tracker, snapshots = _run(tok, vocab, compiler, case, per_char=per_char)
    _check_rollback(ids, matcher, tracker, snapshots)
    assert matcher.accept_token(tok.eos_token_id) and matcher.is_terminated()
    assert tracker.accept(tok.eos_token_id) == Role.TEMPLATE


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_walks_keep_the_track_consistent(tok, vocab, compiler, case, seed):
    import torch

    key, _ = CASES[case]
    rng = random.Random(seed)
    matcher = xgrammar.GrammarMatcher(compile_like_sglang(compiler, key))
    tracker = RoleGrammar.compile("structural_tag", key, vocab).tracker()
    bitmask = xgrammar.allocate_token_bitmask(1, len(vocab))
    bits = torch.arange(32, dtype=torch.int32)
    ids: list[int] = []
    snapshots: list[list[int]] = [[]]
    while len(ids) < 80 and not matcher.is_terminated():
        matcher.fill_next_token_bitmask(bitmask)
        allowed = ((bitmask[0].unsqueeze(-1) >> bits) & 1).flatten()[: len(vocab)].nonzero().flatten().tolist()
        content = [t for t in allowed if t not in vocab.special_ids and vocab.token_bytes[t].strip()]
        t = rng.choice(content if content and rng.random() < 0.9 else allowed)
        assert matcher.accept_token(t)
        tracker.accept(t)
        ids.append(t)
        snapshots.append(list(tracker.roles))
    _check_rollback(ids, matcher, tracker, snapshots)


def test_literal_roles_read_markup_envelopes_and_name_attributes():
    begin = b'<tool_call>\n{"name":"f_1", "arguments":'
    roles = literal_roles(begin, begin=True)
    assert [LABELS[r] for r in roles[:12]] == ["template"] * 11 + ["whitespace"]
    assert {roles[i] for i in range(begin.index(b"f_1"), begin.index(b"f_1") + 3)} == {Role.FUNC_NAME}
    assert roles[begin.index(b"arguments")] == Role.BOUNDARY
    attr = b"<|channel|>commentary to=functions.get_time<|message|>"
    roles = literal_roles(attr)
    assert roles[attr.index(b"get_time")] == Role.FUNC_NAME and roles[0] == Role.TEMPLATE


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"type": "structural_tag"}', "needs 'structures'"),
        ('{"structures": [{"begin": "<a>"}], "triggers": ["<a>"]}', "needs 'begin' and 'end'"),
        ('{"format": {"type": "regex", "pattern": "a+"}}', "'regex' is not supported"),
        ('{"format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}}', "style 'qwen_xml'"),
        ('{"format": {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "json_schema"}]}}',
         "followed by a string"),
        ('{"format": {"type": "triggered_tags", "triggers": ["<x>"], "tags": [{"type": "tag", "begin": "<y>",'
         ' "content": {"type": "any_text"}, "end": "</y>"}]}}', "starts with no trigger"),
    ],
)  # fmt: skip
def test_malformed_or_unsupported_structural_tags_raise(vocab, key, message):
    with pytest.raises(ValueError, match=message):
        RoleGrammar.compile("structural_tag", key, vocab)
