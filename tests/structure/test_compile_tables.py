"""One-time tables: built when the vocabulary or the grammar is compiled, never while tagging.

A JSON schema's navigation tables (alternatives per key and index, key and enum prefixes, narrowing
by enum values) are filled for every reachable candidate set when the role grammar is compiled; the
vocabulary's per-id walk bytes when it is created. Tagging a request must then add nothing to the
schema's tables, and must give exactly the roles that building them on first use gives.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglang_pask.structure import json_schema
from sglang_pask.structure.json_roles import JsonRoleMachine
from sglang_pask.structure.json_schema import ANY, Schema
from sglang_pask.structure.roles import Role
from sglang_pask.structure.tracker import RoleGrammar
from sglang_pask.structure.vocab import TokenVocab


def _envelope(name: str, params: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "properties": {
            "name": {"type": "string", "enum": [name]},
            "parameters": {"type": "object", "properties": params, "required": required},
        },
        "required": ["name", "parameters"],
    }


WEATHER = {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}}
TOOLS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "anyOf": [
            _envelope("get_weather", WEATHER, ["location"]),
            _envelope("get_time", {"timezone": {"type": "string"}, "tags": {"type": "array"}}, ["timezone"]),
        ],
    },
}
# A tree through a $ref cycle: every level has the required key "label".
TREE_SCHEMA = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["label"],
        }
    },
    "$ref": "#/$defs/node",
}
# Outputs that reach every kind of table: narrowing by the function name, a key that is only a prefix
# of a known key ("loc"), an unknown key, an enum value outside the enum, nested arrays, a $ref cycle.
TEXTS = {
    "tools": [
        (
            '[{"name": "get_weather", "parameters": {"location": "Paris", "unit": "celsius", "days": 3}}, '
            '{"name": "get_time", "parameters": {"timezone": "UTC", "tags": ["a", ["b"]]}}]'
        ),
        '[{"parameters": {"loc": "x", "extra": {"k": 1}, "unit": "kelvin"}, "name": "other"}]',
    ],
    "tree": ['{"label": "root", "kids": [{"label": "a", "kids": []}, {"kids": [{"label": "c"}], "label": "b"}]}'],
}
SCHEMAS = {"tools": TOOLS_SCHEMA, "tree": TREE_SCHEMA}


def _table_sizes(schema: Schema) -> dict[str, int]:
    return {name: len(value) for name, value in vars(schema).items() if isinstance(value, (dict, list))}


def _tag(grammar: RoleGrammar, ids: list[int]) -> list[int]:
    tracker = grammar.tracker()
    for t in ids:
        tracker.accept(t)
    return list(tracker.roles)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_tagging_adds_nothing_to_the_schema_tables(vocab, encode, name):
    grammar = RoleGrammar.compile("json", json.dumps(SCHEMAS[name]), vocab)
    assert isinstance(grammar.machine, JsonRoleMachine)
    schema = grammar.machine.schema
    built = _table_sizes(schema)
    assert built["_keys_cache"] > 1 and built["_child_cache"] > 1
    for text in TEXTS[name]:
        roles = _tag(grammar, encode(text)[0])
        assert Role.REQUIRED_KEY in roles or Role.ARG_KEY in roles
    assert _table_sizes(schema) == built


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_tables_built_at_compile_give_the_roles_of_tables_built_on_first_use(vocab, encode, monkeypatch, name):
    key = json.dumps(SCHEMAS[name])
    eager = RoleGrammar.compile("json", key, vocab)
    monkeypatch.setattr(json_schema, "TABLE_LIMIT", 0)
    lazy = RoleGrammar.compile("json", key, vocab)
    lazy_schema = lazy.machine.schema
    before = _table_sizes(lazy_schema)
    for text in TEXTS[name]:
        ids = encode(text)[0]
        assert _tag(eager, ids) == _tag(lazy, ids)
    assert _table_sizes(lazy_schema) != before  # the lazy grammar did build tables while tagging


def test_function_call_roles_with_compiled_tables(vocab, encode):
    text = TEXTS["tools"][0]
    ids, offsets = encode(text)
    roles = _tag(RoleGrammar.compile("json", json.dumps(TOOLS_SCHEMA), vocab), ids)

    def role_at(word: str) -> int:
        start = text.index(word)
        return next(r for r, (s, e) in zip(roles, offsets) if s <= start < e)

    assert role_at("get_weather") == Role.FUNC_NAME
    assert role_at("location") == Role.REQUIRED_KEY
    assert role_at("days") == Role.ARG_KEY  # not required once the name picked get_weather
    assert role_at("celsius") == Role.VALUE_ENUM
    assert role_at("timezone") == Role.REQUIRED_KEY


def test_child_of_a_key_the_schema_does_not_list():
    schema = Schema(
        {
            "properties": {"": {"enum": ["e"]}, "location": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        }
    )
    root = schema.root
    extra = schema.child(root, None)
    assert extra != ANY and not schema.is_enum(extra)
    assert schema.child(root, b"loc") == extra  # a prefix of a known key is an unknown key
    assert schema.child(root, b"other") == extra
    assert schema.is_enum(schema.child(root, b""))  # the empty key is a known key, not "unknown"
    assert schema.child(root, b"location") not in (extra, ANY)


def test_narrowing_by_enum_value():
    schema = Schema(TOOLS_SCHEMA)
    objects = schema.item(schema.root, 0)
    weather, time = objects
    assert schema.narrow(objects, b"name", b"get_weather") == (weather,)
    assert schema.narrow(objects, b"name", b"get_time") == (time,)
    assert schema.narrow(objects, b"name", b"other") == objects  # no alternative fits: keep all
    assert schema.narrow(objects, b"days", b"3") == objects  # no enum under that key
    mixed = Schema({"anyOf": [{"properties": {"k": {"enum": ["a"]}}}, {"properties": {"j": {}}}]})
    first, second = mixed.root
    assert mixed.narrow(mixed.root, b"k", b"b") == (second,)  # alternatives without the key stay
    assert mixed.narrow(mixed.root, b"k", b"a") == (first, second)


def test_a_malformed_part_deep_in_the_schema_fails_at_compile(vocab):
    deep = {"properties": {"a": {"properties": {"b": {"required": "b"}}}}}
    with pytest.raises(ValueError, match="'required' must be"):
        RoleGrammar.compile("json", json.dumps(deep), vocab)


def test_walk_bytes_are_empty_exactly_for_special_tokens():
    vocab = TokenVocab((b"a", b"<|end|>", b"", b"bc"), frozenset({1}))
    assert vocab.walk_bytes == (b"a", b"", b"", b"bc")
    assert vocab.text(1) == b"<|end|>"
    tracker = RoleGrammar.compile("text", "", vocab).tracker()
    assert [tracker.accept(t) for t in (0, 1, 2, 3)] == [Role.FREE_TEXT, Role.TEMPLATE, Role.TEMPLATE, Role.FREE_TEXT]
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tracker.accept(bad)
