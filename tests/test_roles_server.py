"""Structural roles inside a real SGLang server (tiny random model): the role track kept by the
grammar wrapper, ``return_kv_roles`` in responses, and decoding left exactly as stock SGLang's."""

from __future__ import annotations

import json

import pytest
import requests

from sglang_pask.structure import LABELS, RoleGrammar, TokenVocab

pytestmark = pytest.mark.server

PROMPT = "<|im_start|>user\nCall the tool.<|im_end|>\n<|im_start|>assistant\n"
CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather"]},
        "arguments": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detailed": {"type": "boolean"},
            },
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
BFCL_REGEX = r'\[get_weather\(unit="(celsius|fahrenheit)"(, days=[1-7])?\)\]'
SQL_EBNF = r'''root ::= "SELECT " cols " FROM " table ";"
cols ::= col (", " col)*
col[capture="arg_key"] ::= "id" | "name" | "city"
table ::= "users" | "orders"'''

GRAMMARS = {
    "json_schema": {"json_schema": json.dumps(CALL_SCHEMA)},
    "regex": {"regex": BFCL_REGEX},
    "ebnf": {"ebnf": SQL_EBNF},
    "none": {},
}


def generate(server, sampling: dict, text: str = PROMPT) -> requests.Response:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 96, **sampling}}
    return requests.post(f"{server.url}/generate", json=body, timeout=120)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def replay_roles(tokenizer, kind: str, key: str, output_ids: list[int]) -> list[str]:
    """Roles from an offline xgrammar matcher and role tracker fed the same ids in lockstep."""
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=4096, stop_token_ids=[tokenizer.eos_token_id])
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    compiled = {
        "json": lambda: compiler.compile_json_schema(key, any_whitespace=False),
        "regex": lambda: compiler.compile_regex(key),
        "ebnf": lambda: compiler.compile_grammar(key),
    }[kind]()
    matcher = xgrammar.GrammarMatcher(compiled)
    tracker = RoleGrammar.compile(kind, key, TokenVocab.from_xgrammar(info)).tracker(matcher=matcher)
    for token in output_ids:
        assert matcher.accept_token(token)
        tracker.accept(token)
    return [LABELS[r] for r in tracker.roles]


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_greedy_outputs_identical_to_stock_sglang(tiny_server, stock_tiny_server, grammar):
    # Like for like: an empty prefix cache on both, so both compute the whole prompt in one prefill
    # (a cached prefix changes bf16 rounding, which flips near-ties of a random model).
    for server in (tiny_server, stock_tiny_server):
        requests.post(f"{server.url}/flush_cache", timeout=60).raise_for_status()
    ours = generate(tiny_server, GRAMMARS[grammar]).json()
    stock = generate(stock_tiny_server, GRAMMARS[grammar]).json()
    assert ours["output_ids"] == stock["output_ids"]
    assert ours["text"] == stock["text"]


@pytest.mark.parametrize("grammar, kind", [("json_schema", "json"), ("regex", "regex"), ("ebnf", "ebnf")])
def test_returned_roles_are_the_grammar_role_track(tiny_server, tiny_tokenizer, grammar, kind):
    out = generate(tiny_server, {**GRAMMARS[grammar], "return_kv_roles": True}).json()
    roles, output_ids = out["meta_info"]["kv_roles"], out["output_ids"]
    assert len(roles) == len(output_ids)
    assert set(roles) <= set(LABELS)
    # The scheduler's track equals the same grammar replayed offline over the output ids (the last
    # id is the stop token, which the grammar accepts when it terminates).
    key = next(iter(GRAMMARS[grammar].values()))
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert roles == replay_roles(tiny_tokenizer, kind, key, output_ids)
    if kind == "ebnf":
        assert "arg_key" in roles  # from the capture annotation col[capture="arg_key"]


def test_roles_mark_the_structure_of_a_function_call(tiny_server):
    out = generate(tiny_server, {**GRAMMARS["json_schema"], "return_kv_roles": True}).json()
    call = json.loads(out["text"])
    assert call["name"] == "get_weather"
    roles = out["meta_info"]["kv_roles"]
    assert {"required_key", "value_enum", "boundary"} <= set(roles)
    out = generate(tiny_server, {**GRAMMARS["regex"], "return_kv_roles": True}).json()
    assert out["text"].startswith("[get_weather(unit=")
    assert "func_name" in out["meta_info"]["kv_roles"]


def test_prompt_roles_cover_every_prompt_token(tiny_server):
    out = generate(tiny_server, {"return_kv_roles": True, "max_new_tokens": 4}).json()
    prompt_roles = out["meta_info"]["kv_prompt_roles"]
    assert len(prompt_roles) == out["meta_info"]["prompt_tokens"]
    assert prompt_roles[0] == "template" and "user_question" in prompt_roles
    assert len(out["meta_info"]["kv_roles"]) == len(out["output_ids"])


def test_no_roles_unless_asked(tiny_server):
    for flag in ({}, {"return_kv_roles": False}):
        meta = generate(tiny_server, {**GRAMMARS["regex"], **flag}).json()["meta_info"]
        assert "kv_roles" not in meta and "kv_prompt_roles" not in meta


def test_malformed_role_flag_is_a_clear_400(tiny_server):
    response = generate(tiny_server, {"return_kv_roles": "yes"})
    assert response.status_code == 400
    assert "return_kv_roles must be true or false" in response.text
    assert generate(tiny_server, {"max_new_tokens": 2}).status_code == 200  # the server is unharmed
