"""BFCL prompt messages, and the answer grammars checked with real xgrammar."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from sglang_pask.bfcl.data import AST_CATEGORIES, category_of, load_category, load_items
from sglang_pask.bfcl.grammar import call_list_regex, item_ebnf, item_regex, python_value_regex, regex_escape
from sglang_pask.bfcl.oracle import oracle_answer
from sglang_pask.bfcl.prompt import build_messages

_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def _item(item_id: str):
    (item,) = [it for it in load_items([category_of(item_id)]) if it.id == item_id]
    return item


def _accepts(grammar: xgr.Grammar, text: str) -> bool:
    matcher = xgr.GrammarMatcher(_COMPILER.compile_grammar(grammar), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def _both(item) -> list[xgr.Grammar]:
    return [xgr.Grammar.from_regex(item_regex(item)), xgr.Grammar.from_ebnf(item_ebnf(item))]


# Two items per category, plus the answers with the most deeply nested values.
GRAMMAR_ITEMS = [it for c in AST_CATEGORIES for it in load_category(c)[:2]] + [
    _item("simple_python_96"),  # a list of dicts
    _item("simple_python_89"),  # a dict
    _item("live_multiple_121-46-0"),  # dicts inside a dict, a list of dicts
]


# --- prompt ---------------------------------------------------------------------------------------


def test_messages_put_bfcl_system_prompt_with_function_docs_first():
    item = _item("simple_python_0")
    before = json.dumps([item.messages, item.functions], sort_keys=True)
    messages = build_messages(item)
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    assert system.startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]" in system
    docs = json.loads(system[system.index("\n[\n") + 1 :])
    assert [d["name"] for d in docs] == ["calculate_triangle_area"]
    assert docs[0]["description"].endswith("Note that the provided function is in Python 3 syntax.")
    assert messages[1] == item.messages[0]
    # BFCL's pre-processing mutates its inputs: the cached item must stay as loaded.
    assert json.dumps([item.messages, item.functions], sort_keys=True) == before


def test_an_items_own_system_message_follows_bfcls_system_prompt():
    item = next(it for it in load_category("live_simple") if it.messages[0]["role"] == "system")
    messages = build_messages(item)
    assert len(messages) == len(item.messages)
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("You are an expert in composing functions.")
    assert messages[0]["content"].endswith("\n\n" + item.messages[0]["content"])


# --- grammar --------------------------------------------------------------------------------------


@pytest.mark.parametrize("item", GRAMMAR_ITEMS, ids=lambda it: it.id)
def test_grammars_accept_the_oracle_answer(item):
    answer = oracle_answer(item)
    for grammar in _both(item):
        assert _accepts(grammar, answer), answer


def test_grammars_accept_model_style_variants():
    item = _item("simple_python_0")
    for text in (
        "[calculate_triangle_area(base=10, height=5)]",
        "[calculate_triangle_area(base=10,height=5,unit='units')]",
        "[calculate_triangle_area()]",
        "[calculate_triangle_area(base=-1.5e3, height=0.25, unit=None)]",
        '[calculate_triangle_area(base=10, unit="say \\"hi\\""), calculate_triangle_area(height=True)]',
        '[calculate_triangle_area(unit=["a", 1, [2, None], {"k": False}, {}])]',
    ):
        for grammar in _both(item):
            assert _accepts(grammar, text), text


@pytest.mark.parametrize(
    "text",
    [
        "calculate_triangle_area(base=10, height=5)",  # no list brackets
        "[calculate_triangle_area(base=10, height=5)",  # unclosed list
        "[area(base=10, height=5)]",  # unknown function
        "[calculate_triangle_area(width=10)]",  # unknown keyword
        "[calculate_triangle_area(10, 5)]",  # positional arguments
        "[calculate_triangle_area(base=10 height=5)]",  # missing comma
        "[calculate_triangle_area(base=10)] Done.",  # trailing text
        '[calculate_triangle_area(unit="units)]',  # unterminated string
        "[calculate_triangle_area(base=010)]",  # not a Python literal
        "[calculate_triangle_area(base=x)]",  # a name, not a literal
        "[\ncalculate_triangle_area(base=10)]",  # whitespace other than one space after a comma
        "[calculate_triangle_area(base=10),  calculate_triangle_area(base=1)]",
        "[]",  # no call
    ],
)
def test_grammars_reject_malformed_answers(text):
    for grammar in _both(_item("simple_python_0")):
        assert not _accepts(grammar, text), text


def test_regex_keywords_are_restricted_per_function():
    item = _item("multiple_0")
    first, second = item.functions[0], item.functions[1]
    only_second = next(p for p in second["parameters"]["properties"] if p not in first["parameters"]["properties"])
    for grammar in _both(item):
        assert _accepts(grammar, f"[{second['name']}({only_second}=1)]")
        assert not _accepts(grammar, f"[{first['name']}({only_second}=1)]")


def test_regex_value_depth_limits_nesting():
    functions = [{"name": "f", "parameters": {"properties": {"x": {}}}}]
    shallow = xgr.Grammar.from_regex(call_list_regex(functions, value_depth=1))
    assert _accepts(shallow, "[f(x=[1, 2])]")
    assert not _accepts(shallow, "[f(x=[[1], 2])]")
    with pytest.raises(ValueError):
        python_value_regex(-1)


def test_regex_escape_and_bad_input():
    assert regex_escape("math.factorial") == r"math\.factorial"
    assert _accepts(xgr.Grammar.from_regex(regex_escape("a.b(c)[d]")), "a.b(c)[d]")
    with pytest.raises(ValueError):
        call_list_regex([])
    with pytest.raises(ValueError):
        call_list_regex([{"description": "no name"}])
