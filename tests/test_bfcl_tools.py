"""BFCL items as OpenAI tools (types mapped to JSON Schema) and tool calls back as BFCL answers; no server."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.data import AST_CATEGORIES, category_of, load_category, load_items
from sglang_pask.bfcl.offline import import_bfcl
from sglang_pask.bfcl.oracle import oracle_answer
from sglang_pask.bfcl.tools import (
    ToolCall,
    answer_text,
    closed_schema,
    json_schema_type,
    openai_tools,
    parse_arguments,
    schema_errors,
    to_json_schema,
    tool_calls_of,
)

_JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def _item(item_id: str):
    (item,) = [it for it in load_items([category_of(item_id)]) if it.id == item_id]
    return item


# Two items per category, plus the answers with the most deeply nested values.
ITEMS = [it for c in AST_CATEGORIES for it in load_category(c)[:2]] + [
    _item("simple_python_96"),
    _item("simple_python_89"),
    _item("live_multiple_121-46-0"),
]


def _types(schema: dict) -> list:
    """Every ``type`` value in a schema, nested ones too."""
    found = [schema["type"]] if "type" in schema else []
    for sub in (schema.get("properties") or {}).values():
        found += _types(sub)
    if isinstance(schema.get("items"), dict):
        found += _types(schema["items"])
    return found


@pytest.mark.parametrize(
    ("bfcl", "json_type"),
    [
        ("dict", "object"),
        ("float", "number"),
        ("tuple", "array"),
        ("list", "array"),
        ("bool", "boolean"),
        ("any", None),
        ("string", "string"),
        ("integer", "integer"),
        ("array", "array"),
        ("boolean", "boolean"),
    ],
)
def test_bfcl_types_map_to_json_schema_types(bfcl, json_type):
    assert json_schema_type(bfcl) == json_type


def test_an_unknown_type_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown BFCL type 'HashMap'"):
        json_schema_type("HashMap")


def test_nested_types_are_mapped_and_the_input_is_left_unchanged():
    bfcl = {
        "type": "dict",
        "properties": {
            "point": {"type": "tuple", "items": {"type": "float"}, "description": "x, y"},
            "rows": {"type": "array", "items": {"type": "dict", "properties": {"v": {"type": "any"}}}},
            "opts": {"type": "dict", "properties": {"on": {"type": "boolean", "default": False}}, "required": ["on"]},
            "mode": {"type": "string", "enum": ["a", "b"], "optional": True},
        },
        "required": ["point"],
        "optional": ["mode"],
    }
    before = json.dumps(bfcl)
    schema = to_json_schema(bfcl)
    assert json.dumps(bfcl) == before
    assert schema == {
        "type": "object",
        "properties": {
            "point": {"type": "array", "items": {"type": "number"}, "description": "x, y"},
            "rows": {"type": "array", "items": {"type": "object", "properties": {"v": {}}}},
            "opts": {"type": "object", "properties": {"on": {"type": "boolean", "default": False}}, "required": ["on"]},
            "mode": {"type": "string", "enum": ["a", "b"], "optional": True},
        },
        "required": ["point"],
        "optional": ["mode"],
    }


def test_every_ast_item_becomes_tools_of_json_schema_types_only_that_xgrammar_compiles():
    schemas = {}
    for item in load_items(AST_CATEGORIES):
        tools = openai_tools(item)
        assert [t["function"]["name"] for t in tools] == [f["name"] for f in item.functions]
        for tool in tools:
            assert tool["type"] == "function" and set(tool["function"]) == {"name", "description", "parameters"}
            parameters = tool["function"]["parameters"]
            assert parameters["type"] == "object" and set(_types(parameters)) <= _JSON_TYPES
            schemas[json.dumps(parameters, sort_keys=True)] = parameters
    for schema in list(schemas)[:: max(1, len(schemas) // 200)]:  # a spread of them: all take a minute
        xgr.Grammar.from_json_schema(schema)
    with pytest.raises(RuntimeError, match='Unsupported type "dict"'):  # why the mapping is needed
        xgr.Grammar.from_json_schema(json.dumps(ITEMS[0].functions[0]["parameters"]))


def test_tools_carry_bfcl_s_language_hint_and_leave_the_item_unchanged():
    item = ITEMS[0]
    before = json.dumps(item.functions)
    (tool,) = openai_tools(item)
    assert json.dumps(item.functions) == before
    assert tool["function"]["description"].startswith(item.functions[0]["description"])
    assert tool["function"]["description"].endswith("Note that the provided function is in Python 3 syntax.")


def test_answer_text_writes_the_python_call_list_bfcl_decodes():
    calls = [
        ToolCall("math.factorial", '{"number": 5}'),
        ToolCall(
            "g", '{"b": "it\'s \\"x\\"", "n": -2.5e-07, "flag": true, "none": null, "d": {"k": [1, {"z": false}]}}'
        ),
        ToolCall("h", "{}"),
    ]
    text = answer_text(calls)
    assert text.startswith("[math.factorial(number=5), g(b=") and text.endswith(", h()]")
    api = import_bfcl()
    assert api.decode_ast(text, api.return_format_python) == [
        {"math.factorial": {"number": 5}},
        {"g": {"b": 'it\'s "x"', "n": -2.5e-07, "flag": True, "none": None, "d": {"k": [1, {"z": False}]}}},
        {"h": {}},
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("{not json", "arguments are not JSON"),
        ('{"x": NaN}', "NaN is not JSON"),
        ('{"x": Infinity}', "Infinity is not JSON"),
        ("[1, 2]", "arguments are a JSON list, not an object"),
        ('"x"', "arguments are a JSON str, not an object"),
    ],
)
def test_arguments_that_are_not_a_json_object_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        parse_arguments(arguments)
    with pytest.raises(ValueError, match=message):
        answer_text([ToolCall("f", "{}"), ToolCall("g", arguments)])


def test_no_call_is_no_answer():
    with pytest.raises(ValueError, match="no tool calls"):
        answer_text([])


def test_tool_calls_are_read_from_an_openai_message():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
        ],
    }
    assert tool_calls_of(message) == [ToolCall("f", '{"x": 1}'), ToolCall("g", '{"y": 2}')]
    assert tool_calls_of({"role": "assistant", "content": "no call", "tool_calls": None}) == []
    assert tool_calls_of({"role": "assistant", "content": "no call"}) == []


@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_bfcl_s_reference_answers_score_the_same_through_tool_calls(item):
    api = import_bfcl()
    reference = oracle_answer(item)
    calls = [
        ToolCall(name, json.dumps(arguments))
        for call in api.decode_ast(reference, api.return_format_python)
        for name, arguments in call.items()
    ]
    assert check(item, answer_text(calls)).valid == check(item, reference).valid
    wrong = [ToolCall("no_such_function", json.dumps({"x": 1}))]
    assert not check(item, answer_text(wrong)).valid


def test_closed_schema_admits_no_other_keys_where_properties_are_listed():
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "free": {"type": "object"},
        },
        "additionalProperties": True,
    }
    assert closed_schema(schema) == {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            "free": {"type": "object"},
        },
        "additionalProperties": True,  # said explicitly: kept
    }
    assert "additionalProperties" not in schema["properties"]["inner"]  # the input is left unchanged


def test_schema_errors_name_each_violation():
    tools = openai_tools(_item("simple_python_0"))  # calculate_triangle_area(base: int, height: int, unit: str)
    (tool,) = tools
    name = tool["function"]["name"]
    assert tool["function"]["parameters"]["required"] == ["base", "height"]
    assert schema_errors(tools, ToolCall(name, '{"base": 10, "height": 5}')) == []
    assert schema_errors(tools, ToolCall(name, '{"base": 10, "height": 5, "unit": "cm"}')) == []
    assert schema_errors(tools, ToolCall(name, '{"base": "10", "height": 5, "color": "red"}')) == [
        "(arguments): Additional properties are not allowed ('color' was unexpected)",
        "base: '10' is not of type 'integer'",
    ]
    assert schema_errors(tools, ToolCall(name, '{"base": 10}')) == ["(arguments): 'height' is a required property"]
    assert schema_errors(tools, ToolCall(name, '{"base": true, "height": 5}')) == [
        "base: True is not of type 'integer'"
    ]
    assert schema_errors(tools, ToolCall("area", "{}")) == ["no tool named 'area'"]
    assert schema_errors(tools, ToolCall(name, "{oops")) == [
        "arguments are not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    ]


def test_schema_errors_check_formats_and_leave_objects_without_properties_open():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "book",
                "description": "",
                "parameters": to_json_schema(
                    {
                        "type": "dict",
                        "properties": {
                            "day": {"type": "string", "format": "date"},
                            "extras": {"type": "dict"},
                            "any": {"type": "any"},
                        },
                        "required": [],
                    }
                ),
            },
        }
    ]
    assert schema_errors(tools, ToolCall("book", '{"day": "2026-12-07", "extras": {"x": 1}, "any": [1, "a"]}')) == []
    assert schema_errors(tools, ToolCall("book", '{"day": "tomorrow"}')) == ["day: 'tomorrow' is not a 'date'"]
