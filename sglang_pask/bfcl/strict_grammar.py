"""A schema-strict grammar for BFCL answers: the function docs enforced as OpenAI-style strict tools.

:func:`.grammar.call_list_ebnf` allows any keyword of a function in any order, any number of times,
with any Python literal as its value. :func:`strict_call_list_ebnf` allows, for each call, what a
strict JSON-schema tool call allows (xgrammar's JSON-schema grammars, OpenAI ``strict: true``):

- keyword arguments in the order the function doc declares them, each at most once;
- every parameter the doc lists as ``required`` present;
- each value of its declared type: ``string`` a string (either quote), ``integer`` an integer,
  ``float`` any number (BFCL's checker accepts an int there), ``boolean`` ``True``/``False``,
  ``array``/``tuple`` a list of the ``items`` type, ``dict`` a dict; ``any`` or an unknown type any
  Python literal;
- a parameter with an ``enum`` whose values have the declared type: one of those values;
- an optional parameter may also be ``None`` (BFCL's answers pass it for a parameter that defaults
  to ``None``).

It does not say how many calls the answer holds, nor which optional arguments it gives.

BFCL's data is not always as strict as its docs: of the 2351 items of the eight AST categories, 71
have a correct answer (the first allowed value of each argument, in declared order) outside its doc's
types or enums (a boolean where the doc says string, a variable name where it says array, a value
missing from the enum); the grammar refuses those answers.

Rules (xgrammar EBNF, start rule ``root``): ``call``, ``fn_<i>`` (a call of function ``i``),
``arg_<i>_<j>`` (its ``j``-th parameter with its value), ``first_<i>_<j>`` / ``rest_<i>_<j>`` (the
arguments from the ``j``-th on, before / after the first one written), ``type_<k>`` (one per distinct
value type), and :data:`.grammar.EBNF_VALUE_RULES`.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from sglang_pask.bfcl.grammar import EBNF_VALUE_RULES, check_functions, ebnf_literal

_SEP = '"," " "?'
_INTEGER = '"-"? ("0" | [1-9] [0-9]*)'
_SCALARS = {"string": "string", "integer": _INTEGER, "float": "number", "boolean": '"True" | "False"', "dict": "dict"}
_LISTS = ("array", "tuple")
_ENUM_TYPES = {"string": str, "integer": int, "float": (int, float), "boolean": bool}


def _python_literal(value: Any) -> list[str]:
    """The ways Python writes ``value`` (a str, bool, int or float from an ``enum``)."""
    if isinstance(value, str):
        forms = [json.dumps(value, ensure_ascii=False)]
        if "'" not in value and "\\" not in value:
            forms.append(f"'{value}'")
        return forms
    return [repr(value)]


class _TypeRules:
    """One EBNF rule per distinct value type, named ``type_<k>`` in order of first use."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._names: dict[str, str] = {}

    def rule(self, schema: dict[str, Any]) -> str:
        """Name of the rule matching a value of ``schema`` (a BFCL parameter doc)."""
        body = self._body(schema)
        if body not in self._names:
            self._names[body] = f"type_{len(self._names)}"
            self.lines.append(f"{self._names[body]} ::= {body}")
        return self._names[body]

    def _body(self, schema: dict[str, Any]) -> str:
        kind = schema.get("type")
        enum = schema.get("enum")
        wanted = _ENUM_TYPES.get(kind) if isinstance(kind, str) else None
        if (
            isinstance(enum, list)
            and enum
            and wanted is not None
            and all(isinstance(v, wanted) and (kind == "boolean" or not isinstance(v, bool)) for v in enum)
        ):
            forms = dict.fromkeys(form for value in enum for form in _python_literal(value))
            return " | ".join(ebnf_literal(form) for form in forms)
        if kind in _LISTS:
            items = schema.get("items")
            element = self.rule(items) if isinstance(items, dict) else "value"
            return f'"[" ({element} ({_SEP} {element})*)? "]"'
        return _SCALARS.get(kind, "value") if isinstance(kind, str) else "value"


def _function_rules(i: int, function: dict[str, Any], types: _TypeRules) -> list[str]:
    """The rules of one function: ``fn_<i>``, its arguments and their order."""
    properties: dict[str, Any] = function["parameters"].get("properties", {})
    names = list(properties)
    required = set(function["parameters"].get("required") or [])
    head = ebnf_literal(function["name"] + "(")
    if not names:
        return [f'fn_{i} ::= {head} ")"']
    lines = []
    for j, name in enumerate(names):
        schema = properties[name] if isinstance(properties[name], dict) else {}
        value = types.rule(schema) if name in required else f'({types.rule(schema)} | "None")'
        lines.append(f"arg_{i}_{j} ::= {ebnf_literal(name + '=')} {value}")
    last = len(names) - 1
    for j, name in enumerate(names[1:], start=1):
        tail = f" rest_{i}_{j + 1}" if j < last else ""
        written = f"({_SEP} arg_{i}_{j})"
        lines.append(f"rest_{i}_{j} ::= {written if name in required else written + '?'}{tail}")
    for j, name in enumerate(names):
        tail = f" rest_{i}_{j + 1}" if j < last else ""
        if name in required or j == last:
            lines.append(f"first_{i}_{j} ::= arg_{i}_{j}{tail}")
            break
        lines.append(f"first_{i}_{j} ::= (arg_{i}_{j}{tail}) | first_{i}_{j + 1}")
    first = f"first_{i}_0" if required & set(names) else f"first_{i}_0?"
    return [f'fn_{i} ::= {head} {first} ")"', *lines]


def strict_call_list_ebnf(functions: Sequence[dict[str, Any]]) -> str:
    """Schema-strict EBNF grammar (xgrammar dialect, start rule ``root``) of a BFCL answer.

    Parameters
    ----------
    functions : sequence of dict
        BFCL function docs (``name``, ``parameters.properties``, ``parameters.required``).

    Returns
    -------
    str
        A grammar for SGLang's ``ebnf`` sampling param (rules in the module docstring).

    Raises
    ------
    ValueError
        If ``functions`` is empty or not BFCL function docs.
    """
    check_functions(functions)
    types = _TypeRules()
    lines = [
        'root ::= "[" call ("," " "? call)* "]"',
        "call ::= " + " | ".join(f"fn_{i}" for i in range(len(functions))),
    ]
    for i, function in enumerate(functions):
        lines.extend(_function_rules(i, function, types))
    return "\n".join([*lines, *types.lines, EBNF_VALUE_RULES])
