"""The role vocabulary is stable (values live in tensors and policy files) and the priority rule holds."""

from __future__ import annotations

import pytest

from sglang_pask.structure.grammar_info import analyze_ebnf, analyze_regex
from sglang_pask.structure.roles import LABELS, PRIORITY, Role, combine, combine_all

# Written out so that renumbering a role fails here: append new roles, never reuse values.
STABLE_VALUES = {
    "whitespace": 0,
    "boundary": 1,
    "free_text": 2,
    "func_name": 3,
    "arg_key": 4,
    "required_key": 5,
    "value_string": 6,
    "value_number": 7,
    "value_bool": 8,
    "value_null": 9,
    "value_enum": 10,
    "template": 11,
    "system_text": 12,
    "user_question": 13,
    "schema_func_name": 14,
    "schema_param_name": 15,
    "schema_required": 16,
    "schema_type": 17,
    "schema_enum": 18,
    "schema_description": 19,
    "schema_example": 20,
}


def test_values_and_labels_are_stable():
    assert {r.label: int(r) for r in Role} == STABLE_VALUES
    assert list(LABELS) == list(STABLE_VALUES)
    for label, value in STABLE_VALUES.items():
        assert Role.from_label(label) == value
    with pytest.raises(ValueError, match="unknown role name"):
        Role.from_label("argument")


def test_priority_rule():
    assert sorted(PRIORITY) == list(Role)
    assert combine(Role.BOUNDARY, Role.ARG_KEY) == Role.ARG_KEY  # {"loc
    assert combine(Role.VALUE_STRING, Role.BOUNDARY) == Role.VALUE_STRING  # "San
    assert combine(Role.WHITESPACE, Role.BOUNDARY) == Role.BOUNDARY  # ' "'
    assert combine(Role.VALUE_NUMBER, Role.REQUIRED_KEY) == Role.REQUIRED_KEY  # 1, "b
    assert combine_all([Role.BOUNDARY, Role.FUNC_NAME, Role.ARG_KEY]) == Role.FUNC_NAME
    assert combine_all([]) == Role.TEMPLATE


def test_regex_analysis_of_a_bfcl_call_grammar():
    area = r'area\(base=\d+, height=\d+(, unit=("m"|"cm"))?(, exact=(True|False))?\)'
    info = analyze_regex(rf"\[({area}|math\.factorial\(n=\d+\))(, ({area}))*\]")
    assert info.call_syntax
    specs = {f.name: f for f in info.functions}
    assert set(specs) == {"area", "math.factorial"}
    assert specs["area"].required == {"base", "height"}
    assert specs["area"].params == {"base", "height", "unit", "exact"}
    assert specs["area"].enums == {"unit"}  # (True|False) is a boolean, not an enum
    assert specs["math.factorial"].required == {"n"}
    assert not analyze_regex(r"\d{3}-\d{4}").call_syntax


def test_ebnf_analysis_tells_call_grammars_from_others():
    calls = analyze_ebnf(
        'root ::= "[" call ("," " "? call)* "]"\ncall ::= fn_0\n'
        'fn_0 ::= "math.factorial(" (key_0 "=" value)? ")"\nkey_0 ::= "number"\nvalue ::= [0-9]+'
    )
    assert calls.call_syntax
    assert [f.name for f in calls.functions] == ["math.factorial"]
    sql = analyze_ebnf('root ::= "SELECT " col " FROM " col " WHERE " col " = " [0-9]+  # "comment("\ncol ::= [a-z]+')
    assert not sql.call_syntax
    assert {"SELECT", "FROM", "WHERE"} <= sql.keywords and "comment" not in sql.keywords
