"""``--strict-tools``: every offered tool's arguments are held to its JSON Schema (issue 51, problem 2).

Without it, SGLang 0.5.23's structural tag for ``tool_choice: "required"`` constrains the arguments of
a tool not marked ``strict`` to any JSON object: a call of ``get_quote`` with ``{"symbol": "MSFT"}``
where ``ticker`` is required passes. The checks build the constraint with SGLang's own function-call
parser (the ``qwen25`` format the launcher picks for the default model) and compile it with SGLang's
xgrammar backend and real xgrammar, as a server does for each request.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

import pytest
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser

from sglang_pask.launch_server import TOOL_STRICT_LEVEL_ENV, TOOL_STRICT_PARAMETERS, prepare

QUOTE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_quote",
        "description": "Stock quote.",
        "parameters": {
            "type": "object",
            "properties": {"ticker": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["ticker"],
            "additionalProperties": False,
        },
    },
}


def required_call_accepts(tok, arguments: str, strict_tool: bool = False) -> bool:
    """Whether the grammar SGLang builds for ``tool_choice: "required"`` accepts a ``get_quote`` call
    with these arguments."""
    tool = json.loads(json.dumps(QUOTE_TOOL))
    if strict_tool:
        tool["function"]["strict"] = True
    parser = FunctionCallParser([Tool(**tool)], "qwen25")
    kind, tag = parser.get_structure_constraint("required")
    assert kind == "structural_tag"
    backend = XGrammarGrammarBackend(tok, vocab_size=len(tok))
    grammar = backend.dispatch_structural_tag(json.dumps(tag.model_dump(by_alias=True)))
    (structure,) = tag.structures
    return grammar.matcher.accept_string(structure.begin + arguments + structure.end)


def test_without_the_flag_a_tool_not_marked_strict_takes_any_json_object(tok, monkeypatch):
    monkeypatch.delenv(TOOL_STRICT_LEVEL_ENV, raising=False)
    assert required_call_accepts(tok, '{"symbol": "MSFT"}')  # the problem: ticker missing, unknown key
    assert not required_call_accepts(tok, '{"symbol": "MSFT"}', strict_tool=True)


def test_with_the_flags_level_every_tools_arguments_meet_its_schema(tok, monkeypatch):
    monkeypatch.setenv(TOOL_STRICT_LEVEL_ENV, TOOL_STRICT_PARAMETERS)
    assert not required_call_accepts(tok, '{"symbol": "MSFT"}')
    assert not required_call_accepts(tok, '{"ticker": 5}')
    assert required_call_accepts(tok, '{"ticker": "MSFT", "days": 5}')


@pytest.fixture
def launcher_environment() -> Iterator[None]:
    """The launcher publishes its config and SGLang's settings in ``os.environ``; put it back after."""
    saved = dict(os.environ)
    os.environ.pop(TOOL_STRICT_LEVEL_ENV, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("flags, level", [(["--strict-tools"], TOOL_STRICT_PARAMETERS), ([], None)])
def test_the_launcher_sets_sglangs_level_for_the_server_processes(
    tiny_model_dir, monkeypatch, launcher_environment, flags, level
):
    monkeypatch.setattr("sglang_pask.launch_server._gpu_available", lambda: False)
    config, _ = prepare(["--model-path", str(tiny_model_dir), *flags])
    assert config.strict_tools is bool(flags)
    assert os.environ.get(TOOL_STRICT_LEVEL_ENV) == level
