"""Prompt-token roles: a hand-written golden prompt with two tool schemas, checked token by token."""

from __future__ import annotations

import json

import pytest
from golden_markup import expected_token_roles, parse_markup

from sglang_pask.structure.prompt import (
    char_roles,
    find_function_docs,
    function_doc_spans,
    tag_prompt,
    tag_prompt_ids,
)
from sglang_pask.structure.roles import LABELS, Role
from sglang_pask.structure.vocab import TokenVocab, hf_special_tokens

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]

# The chat template (sglang_pask.structure.toy_tokenizer.CHAT_TEMPLATE) rendered for MESSAGES and
# the two tools, with every character's role written out.
GOLDEN_PROMPT = (
    "⟦P|<|im_start|>system\n⟧⟦Y|You are a helpful assistant.\n\n# Tools\n\nYou can call these "
    "functions:\n<tools>\n⟧"
    '{"type": "function", "function": {"name": "⟦f|get_weather⟧", "description": "⟦d|Current weather in a '
    'city.⟧", "parameters": {"type": "⟦t|object⟧", "properties": {"⟦p|city⟧": {"type": "⟦t|string⟧", '
    '"description": "⟦d|City name.⟧"}, "⟦p|unit⟧": {"type": "⟦t|string⟧", "enum": ["⟦e|celsius⟧", '
    '"⟦e|fahrenheit⟧"]}}, "required": ["⟦r|city⟧"]}}}'
    "⟦Y|\n⟧"
    '{"type": "function", "function": {"name": "⟦f|get_time⟧", "description": "⟦d|Local time.⟧", '
    '"parameters": {"type": "⟦t|object⟧", "properties": {"⟦p|timezone⟧": {"type": "⟦t|string⟧"}}, '
    '"required": ["⟦r|timezone⟧"]}}}'
    "⟦Y|\n</tools>⟧⟦P|<|im_end|>\n<|im_start|>user\n⟧⟦U|What is the weather in Paris?⟧"
    "⟦P|<|im_end|>\n<|im_start|>assistant\n⟧"
)


def _table(tok, ids, got, want) -> str:
    return "\n".join(
        f"{tok.decode([i])!r:>20} {LABELS[g]:>18} {LABELS[w]:>18}{'' if g == w else '  <-- differs'}"
        for i, g, w in zip(ids, got, want)
    )


def test_golden_prompt_with_two_tool_schemas(tok, encode):
    text, roles = parse_markup(GOLDEN_PROMPT)
    rendered = tok.apply_chat_template(MESSAGES, tools=[WEATHER, TIME], tokenize=False, add_generation_prompt=True)
    assert rendered == text
    ids, offsets = encode(text)
    got = tag_prompt(text, offsets, tok.all_special_tokens, tools=[WEATHER, TIME])
    want = expected_token_roles(roles, offsets)
    assert got == want, _table(tok, ids, got, want)
    assert list(char_roles(text, tok.all_special_tokens, tools=[WEATHER, TIME])) == roles


# A function doc as json.dumps writes it, with the examples its descriptions and default show: a
# clause after "e.g.", a single-quoted and an escaped double-quoted literal, apostrophes that open
# nothing, a default value.
EXAMPLE_DOC = {
    "name": "get_weather",
    "description": "Weather for a place, e.g. Paris, France; not the forecast.",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "In the format of 'City, State', such as \"San Francisco, CA\". "
                "The city's name doesn't include the country.",
                "default": "Boston, MA",
            }
        },
        "required": ["location"],
    },
}
GOLDEN_EXAMPLES = (
    '{"name": "⟦f|get_weather⟧", "description": "⟦d|Weather for a place, e.g. ⟧⟦x|Paris, France⟧'
    '⟦d|; not the forecast.⟧", "parameters": {"type": "⟦t|object⟧", "properties": {"⟦p|location⟧": '
    '{"type": "⟦t|string⟧", "description": "⟦d|In the format of \'⟧⟦x|City, State⟧⟦d|\', such as \\"⟧'
    "⟦x|San Francisco, CA⟧⟦d|\\\". The city's name doesn't include the country.⟧\", "
    '"default": "⟦x|Boston, MA⟧"}}, "required": ["⟦r|location⟧"]}}'
)


def test_examples_inside_a_schema_are_schema_example():
    text, roles = parse_markup(GOLDEN_EXAMPLES)
    assert text == json.dumps(EXAMPLE_DOC)
    got = char_roles(text)
    assert [LABELS[r] for r in got] == [LABELS[r] for r in roles]
    assert Role.SCHEMA_EXAMPLE in set(got)


def test_roles_from_token_ids_match_roles_from_offsets(tok, vocab, encode):
    text, _ = parse_markup(GOLDEN_PROMPT)
    text = text.replace("Paris?", "Zürich, 東京 or São Paulo?")  # characters split across byte tokens
    ids, offsets = encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some token holds part of a character
    assert tag_prompt_ids(ids, vocab, tools=[WEATHER, TIME]) == tag_prompt(text, offsets, tok.all_special_tokens)


def test_bfcl_function_docs_in_the_system_prompt(tok, vocab, encode):
    docs = [
        {
            "name": "calculate_triangle_area",
            "description": "Calculate the area of a triangle given its base and height.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "base": {"type": "integer", "description": "The base of the triangle."},
                    "unit": {"type": "string", "description": "The unit.", "enum": ["units", "cm"]},
                },
                "required": ["base"],
            },
        }
    ]
    system = (
        "You are an expert in composing functions.\n\nHere is a list of functions in JSON format that you can invoke.\n"
    )
    messages = [
        {"role": "system", "content": system + json.dumps(docs, indent=4) + "\n"},
        {"role": "user", "content": "Find the area of a triangle with a base of 10 units."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, offsets = encode(text)
    roles = tag_prompt_ids(ids, vocab)

    def roles_of(fragment: str, start: int = 0) -> set[str]:
        s = text.index(fragment, start)
        return {LABELS[r] for r, (a, b) in zip(roles, offsets) if a < s + len(fragment) and b > s}

    docs_at = text.index("[\n")
    assert roles_of("calculate_triangle_area", docs_at) == {"schema_func_name"}
    assert roles_of('"integer"', docs_at) >= {"schema_type"}
    assert "schema_param_name" in roles_of('"base": {', docs_at)
    assert "schema_required" in roles_of('"base"\n', docs_at)
    assert roles_of("The base of the triangle", docs_at) == {"schema_description"}
    assert roles_of("cm", docs_at) == {"schema_enum"}
    assert roles_of("expert in composing") == {"system_text"}
    assert roles_of("Find the area of a triangle") == {"user_question"}
    assert roles_of("<|im_start|>") == {"template"}
    assert "whitespace" in {LABELS[r] for r in roles}  # the indentation of json.dumps(indent=4)


def test_tools_filter_and_malformed_tools():
    other = {"name": "not_offered", "parameters": {"type": "object", "properties": {}}}
    text = json.dumps([WEATHER["function"], other])
    assert [d.get("name").value for d in function_doc_spans(text)] == ["get_weather", "not_offered"]
    assert [d.get("name").value for d in function_doc_spans(text, tools=[WEATHER])] == ["get_weather"]
    with pytest.raises(ValueError, match="not a tool"):
        function_doc_spans(text, tools=[{"description": "no name"}])


def test_llama3_style_headers_and_json_that_is_not_a_function_doc():
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    text = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        '<|start_header_id|>user<|end_header_id|>\n\nParse {"a": 1} please.<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    roles = char_roles(text, specials)
    by_text = {
        "Be brief.": Role.SYSTEM_TEXT,
        '{"a": 1}': Role.USER_QUESTION,
        "Parse": Role.USER_QUESTION,
        "assistant": Role.TEMPLATE,
        "system": Role.TEMPLATE,
        "\n\nBe": Role.TEMPLATE,
    }
    for fragment, role in by_text.items():
        s = text.index(fragment)
        span = roles[s : s + len(fragment)] if fragment != "\n\nBe" else roles[s : s + 2]
        assert set(span) == {role}, fragment


def test_find_function_docs_reads_the_tools_back_from_the_prompt(tok):
    text = tok.apply_chat_template(MESSAGES, tools=[WEATHER, TIME], tokenize=False, add_generation_prompt=True)
    assert find_function_docs(text) == [WEATHER, TIME]


@pytest.mark.real_model
def test_default_model_chat_template_with_tools(qwen_tok):
    """The Qwen2.5 template: tools as JSON lines in the system message, ChatML headers."""
    text = qwen_tok.apply_chat_template(MESSAGES, tools=[WEATHER, TIME], tokenize=False, add_generation_prompt=True)
    enc = qwen_tok(text, add_special_tokens=False, return_offsets_mapping=True)
    roles = tag_prompt(text, enc["offset_mapping"], hf_special_tokens(qwen_tok))
    assert roles == tag_prompt_ids(enc["input_ids"], TokenVocab.from_huggingface(qwen_tok))
    chars = char_roles(text, hf_special_tokens(qwen_tok))
    for fragment, role in [
        ("<|im_start|>system\n", Role.TEMPLATE),
        ("You are a helpful assistant.", Role.SYSTEM_TEXT),
        ("get_weather", Role.SCHEMA_FUNC_NAME),
        ("timezone", Role.SCHEMA_PARAM_NAME),
        ("fahrenheit", Role.SCHEMA_ENUM),
        ("What is the weather in Paris?", Role.USER_QUESTION),
        ("<|im_start|>assistant\n", Role.TEMPLATE),
    ]:
        start = text.index(fragment)
        assert set(chars[start : start + len(fragment)]) == {role}, fragment
