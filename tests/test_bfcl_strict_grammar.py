"""The schema-strict BFCL answer grammar, checked with real xgrammar on BFCL's own function docs."""

from __future__ import annotations

import re

import pytest
import xgrammar as xgr

from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.constraints import CONSTRAINTS, answer_constraint
from sglang_pask.bfcl.data import AST_CATEGORIES, category_of, load_category, load_items
from sglang_pask.bfcl.grammar import call_list_ebnf, item_ebnf
from sglang_pask.bfcl.oracle import oracle_answer
from sglang_pask.bfcl.strict_grammar import strict_call_list_ebnf

_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def _item(item_id: str):
    (item,) = [it for it in load_items([category_of(item_id)]) if it.id == item_id]
    return item


def _accepts(ebnf: str, text: str) -> bool:
    matcher = xgr.GrammarMatcher(
        _COMPILER.compile_grammar(xgr.Grammar.from_ebnf(ebnf)), terminate_without_stop_token=True
    )
    return matcher.accept_string(text) and matcher.is_terminated()


# BFCL's possible answer of this item is outside its own doc's enum (checked below).
OUTSIDE_ITS_ENUM = "live_parallel_multiple_2-2-0"


@pytest.mark.parametrize(
    "item",
    [it for c in AST_CATEGORIES for it in load_category(c)[:3] if it.id != OUTSIDE_ITS_ENUM],
    ids=lambda it: it.id,
)
def test_the_oracle_answer_in_declared_order_is_accepted_and_correct(item):
    answer = oracle_answer(item, declared_order=True)
    assert check(item, answer).valid, answer
    assert _accepts(strict_call_list_ebnf(item.functions), answer), answer


def test_an_answer_outside_the_docs_enum_is_refused_even_where_bfcl_expects_it():
    item = _item(OUTSIDE_ITS_ENUM)
    answer = oracle_answer(item, declared_order=True)
    assert check(item, answer).valid
    assert _accepts(item_ebnf(item), answer) and not _accepts(strict_call_list_ebnf(item.functions), answer)


def test_what_the_loose_grammar_allows_and_the_strict_one_does_not():
    item = _item("simple_python_0")  # base: integer, height: integer (both required), unit: string
    loose, strict = item_ebnf(item), strict_call_list_ebnf(item.functions)
    for text in (
        "[calculate_triangle_area(base=10)]",  # a required argument missing
        "[calculate_triangle_area()]",
        "[calculate_triangle_area(height=5, base=10)]",  # not the declared order
        "[calculate_triangle_area(base=10, base=10, height=5)]",  # a keyword repeated
        '[calculate_triangle_area(base="10", height=5)]',  # a string for an integer
        "[calculate_triangle_area(base=1.5, height=5)]",  # a float for an integer
        "[calculate_triangle_area(base=10, height=5, unit=3)]",  # a number for a string
        "[calculate_triangle_area(base=None, height=5)]",  # None for a required argument
    ):
        assert _accepts(loose, text), text
        assert not _accepts(strict, text), text
    for text in (
        "[calculate_triangle_area(base=10, height=5)]",
        "[calculate_triangle_area(base=-3,height=5,unit='cm')]",
        '[calculate_triangle_area(base=10, height=5, unit=None), calculate_triangle_area(base=0, height=1, unit="m")]',
    ):
        assert _accepts(strict, text), text


def test_enums_arrays_floats_booleans_and_untyped_values():
    functions = [
        {
            "name": "f",
            "parameters": {
                "type": "dict",
                "properties": {
                    "unit": {"type": "string", "enum": ["celsius", "it's"]},
                    "level": {"type": "integer", "enum": [1, 2]},
                    "xs": {"type": "array", "items": {"type": "float"}},
                    "flag": {"type": "boolean"},
                    "blob": {"type": "any"},
                    "mixed": {"type": "integer", "enum": ["1", "2"]},  # enum values not of the type: the type rules
                },
                "required": ["unit"],
            },
        },
        {"name": "g", "parameters": {"type": "dict", "properties": {}}},
    ]
    ebnf = strict_call_list_ebnf(functions)
    for text in (
        "[f(unit='celsius')]",
        '[f(unit="it\'s")]',
        '[f(unit="celsius", level=2, xs=[1, 2.5, -3e2], flag=False)]',
        '[f(unit="celsius", blob={"k": [None]}, mixed=7), g()]',
    ):
        assert _accepts(ebnf, text), text
    for text in (
        "[f(unit='kelvin')]",
        "[f(unit='it's')]",
        "[f(unit='celsius', level=3)]",
        "[f(unit='celsius', xs=['a'])]",
        "[f(unit='celsius', flag=1)]",
        "[f(unit='celsius', mixed='1')]",
        "[g(unit='celsius')]",
    ):
        assert not _accepts(ebnf, text), text


def test_a_function_without_required_parameters_may_be_called_with_none_or_any_subset():
    functions = [
        {
            "name": "h",
            "parameters": {
                "type": "dict",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            },
        }
    ]
    ebnf = strict_call_list_ebnf(functions)
    for text in ("[h()]", "[h(a=1)]", "[h(b=2)]", "[h(c=3)]", "[h(a=1, c=3)]", "[h(b=2, c=3)]", "[h(a=1, b=2, c=3)]"):
        assert _accepts(ebnf, text), text
    for text in ("[h(c=3, a=1)]", "[h(a=1, a=1)]", "[h(,a=1)]", "[h(a=1,)]"):
        assert not _accepts(ebnf, text), text


def test_required_parameters_after_optional_ones():
    functions = [
        {
            "name": "k",
            "parameters": {
                "type": "dict",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
                "required": ["b"],
            },
        }
    ]
    ebnf = strict_call_list_ebnf(functions)
    for text in ("[k(b=2)]", "[k(a=1, b=2)]", "[k(b=2, c=3)]", "[k(a=1, b=2, c=3)]"):
        assert _accepts(ebnf, text), text
    for text in ("[k()]", "[k(a=1)]", "[k(c=3)]", "[k(a=1, c=3)]"):
        assert not _accepts(ebnf, text), text


def test_bad_function_docs_are_refused_with_the_problem_named():
    bad = {
        "at least one function": [],
        "not a BFCL function doc": [{"description": "no name"}],
        "not a BFCL function doc: {'name': 'f', 'parameters': 3}": [{"name": "f", "parameters": 3}],
        "'properties' must be an object": [{"name": "f", "parameters": {"properties": ["a"]}}],
        "'required' must be a list of names": [{"name": "f", "parameters": {"properties": {}, "required": "a"}}],
    }
    for message, functions in bad.items():
        for build in (strict_call_list_ebnf, call_list_ebnf):
            with pytest.raises(ValueError, match=re.escape(message)):
                build(functions)


def test_answer_constraints_by_name():
    item = _item("simple_python_0")
    assert CONSTRAINTS[0] == "ebnf" and set(CONSTRAINTS) == {"ebnf", "ebnf-strict", "regex", "none"}
    assert answer_constraint(item, "ebnf") == {"ebnf": item_ebnf(item)}
    assert answer_constraint(item, "ebnf-strict") == {"ebnf": strict_call_list_ebnf(item.functions)}
    assert set(answer_constraint(item, "regex")) == {"regex"} and answer_constraint(item, "none") == {}
    with pytest.raises(ValueError, match="unknown answer constraint 'json'"):
        answer_constraint(item, "json")
