"""BFCL items as OpenAI tools, and the tool calls a server returns as answers BFCL's checker scores.

BFCL's function docs look like JSON Schema but use their own type names (``dict``, ``float``,
``tuple``, ``any``); :func:`to_json_schema` maps them, so that a server that holds tool arguments
to their schema (SGLang's strict tools, xgrammar) can compile it. The rest of a doc is kept as BFCL
stores it (``enum``, ``default``, ``format``, BFCL's own ``optional``). Function names keep their
dots (``math.factorial``), as BFCL's Qwen function-calling handler sends them.

The way back: :func:`answer_text` writes the returned calls as the Python call list
``[f(a=1), g(b='x')]`` that :func:`sglang_pask.bfcl.checker.check` parses, and
:func:`schema_errors` says whether a call's arguments hold to its tool's schema as strict decoding
enforces it (:func:`closed_schema`).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import jsonschema

from sglang_pask.bfcl.data import BfclItem
from sglang_pask.bfcl.offline import import_bfcl

#: BFCL's type names in its Python categories -> JSON Schema types; ``None``: any JSON value (no
#: ``type``). BFCL's own function-calling handlers send ``any`` as ``string``; a value of any type
#: is what BFCL's Python checker accepts for it, so it is left open here.
BFCL_TYPES: dict[str, str | None] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "float": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "null": "null",
    "any": None,
}

# The keywords whose values are schemas (one, a list of them, or a name -> schema map).
_SUBSCHEMA = ("items", "additionalProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties",)


def json_schema_type(bfcl_type: str) -> str | None:
    """The JSON Schema type of a BFCL type name.

    Parameters
    ----------
    bfcl_type : str
        E.g. ``"dict"``, ``"float"``, ``"tuple"``, ``"any"`` or a JSON Schema type itself.

    Returns
    -------
    str or None
        E.g. ``"object"``, ``"number"``, ``"array"``; ``None`` for ``any`` (no type constraint).

    Raises
    ------
    ValueError
        If ``bfcl_type`` is not a type name BFCL's Python categories use.
    """
    try:
        return BFCL_TYPES[bfcl_type]
    except KeyError:
        raise ValueError(f"unknown BFCL type {bfcl_type!r}; known: {', '.join(BFCL_TYPES)}") from None


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema: every ``type`` mapped by :func:`json_schema_type`, in
    nested properties and items too; ``schema`` is left unchanged.

    Parameters
    ----------
    schema : dict
        E.g. a function doc's ``parameters`` (``{"type": "dict", "properties": ..., "required": ...}``).

    Returns
    -------
    dict
        A new schema; a ``type`` that maps to ``None`` (``any``) is removed.
    """
    out = {}
    for key, value in schema.items():
        if key == "type":
            types = [json_schema_type(t) for t in ([value] if isinstance(value, str) else value)]
            if None in types:  # any: no constraint
                continue
            out[key] = types[0] if isinstance(value, str) else list(dict.fromkeys(types))
        elif key in _SUBSCHEMA and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [to_json_schema(v) if isinstance(v, dict) else v for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: to_json_schema(v) if isinstance(v, dict) else v for name, v in value.items()}
        else:
            out[key] = copy.deepcopy(value)
    return out


def openai_tools(item: BfclItem) -> list[dict[str, Any]]:
    """An item's functions as the ``tools`` of an OpenAI chat request.

    The descriptions get BFCL's language hint, as BFCL's generation step adds it in both its
    prompting and its function-calling modes.

    Parameters
    ----------
    item : BfclItem
        The item (left unchanged).

    Returns
    -------
    list of dict
        ``[{"type": "function", "function": {"name", "description", "parameters"}}, ...]`` with the
        parameters as JSON Schema (:func:`to_json_schema`).
    """
    api = import_bfcl()
    functions = api.func_doc_language_specific_pre_processing(item.copy_functions(), item.category)
    return [
        {
            "type": "function",
            "function": {
                "name": f["name"],
                "description": f.get("description", ""),
                "parameters": to_json_schema(f["parameters"]),
            },
        }
        for f in functions
    ]


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as strict decoding holds arguments to it: an object schema that lists
    ``properties`` and says nothing of ``additionalProperties`` admits no other keys (xgrammar's
    strict mode, the default of SGLang's strict tools); an object without ``properties`` stays open.

    Parameters
    ----------
    schema : dict
        A JSON Schema (e.g. from :func:`to_json_schema`); left unchanged.

    Returns
    -------
    dict
        A new schema.
    """
    out = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA and isinstance(value, dict):
            out[key] = closed_schema(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [closed_schema(v) if isinstance(v, dict) else v for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_schema(v) if isinstance(v, dict) else v for name, v in value.items()}
        else:
            out[key] = copy.deepcopy(value)
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class ToolCall:
    """One call as the server returned it.

    Attributes
    ----------
    name : str
        The function's name.
    arguments : str
        The arguments as the server sent them: JSON text of an object, if the model wrote one.
    """

    name: str
    arguments: str


def tool_calls_of(message: dict[str, Any]) -> list[ToolCall]:
    """The calls of an OpenAI chat completion's ``message`` (none: an empty list).

    Parameters
    ----------
    message : dict
        ``choices[0]["message"]`` of a ``/v1/chat/completions`` response.

    Returns
    -------
    list of ToolCall
        In the order returned. Arguments sent as an object rather than JSON text are turned into
        JSON text.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(ToolCall(name=str(function.get("name") or ""), arguments=arguments))
    return calls


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parse_arguments(arguments: str) -> dict[str, Any]:
    """A call's arguments as a dict.

    Parameters
    ----------
    arguments : str
        JSON text.

    Returns
    -------
    dict
        The arguments by name.

    Raises
    ------
    ValueError
        If the text is not strict JSON (``NaN`` and ``Infinity`` are refused) or not an object.
    """
    try:
        value = json.loads(arguments, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ValueError(f"arguments are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments are a JSON {type(value).__name__}, not an object")
    return value


def _python_literal(value: Any) -> str:
    """A JSON value as Python source (``repr`` does it for every JSON type but non-finite floats,
    which :func:`parse_arguments` refuses)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} has no Python literal")
    return repr(value)


def answer_text(calls: Sequence[ToolCall]) -> str:
    """The calls as the Python call list BFCL's prompting-mode decoder reads.

    Parameters
    ----------
    calls : sequence of ToolCall
        The returned calls.

    Returns
    -------
    str
        E.g. ``"[math.factorial(number=5), g(b='x')]"``.

    Raises
    ------
    ValueError
        If there is no call, or a call's arguments are not a JSON object.
    """
    if not calls:
        raise ValueError("no tool calls")
    parts = []
    for call in calls:
        arguments = parse_arguments(call.arguments)
        parts.append(f"{call.name}({', '.join(f'{k}={_python_literal(v)}' for k, v in arguments.items())})")
    return f"[{', '.join(parts)}]"


_VALIDATOR = jsonschema.Draft202012Validator


def schema_errors(tools: Sequence[dict[str, Any]], call: ToolCall) -> list[str]:
    """Where a call's arguments break its tool's schema, as strict decoding holds them to it.

    Parameters
    ----------
    tools : sequence of dict
        The tools the request offered (:func:`openai_tools`).
    call : ToolCall
        One returned call.

    Returns
    -------
    list of str
        Empty when the arguments validate against :func:`closed_schema` of the named tool's
        parameters (formats such as ``date`` checked); else one message per violation (an unknown
        tool name or arguments that are not a JSON object are violations too).
    """
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in by_name:
        return [f"no tool named {call.name!r}"]
    try:
        arguments = parse_arguments(call.arguments)
    except ValueError as exc:
        return [str(exc)]
    validator = _VALIDATOR(
        closed_schema(by_name[call.name].get("parameters") or {}), format_checker=_VALIDATOR.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(arguments)'}: {e.message}" for e in errors]
