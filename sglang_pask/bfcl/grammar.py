"""Grammar constraints for BFCL answers: a Python call list over the item's own functions.

BFCL's prompting format asks for ``[func_name1(param1=value1, param2=value2), func_name2(...)]``.
Two equivalent forms are built for SGLang's sampling params (both in xgrammar's dialects):

- :func:`call_list_regex` (``regex``): function names restricted to the item's functions, keyword
  names to each function's parameters, values Python literals (strings in either quote, numbers,
  ``True``/``False``/``None``, lists and dicts nested up to ``value_depth`` levels).
- :func:`call_list_ebnf` (``ebnf``): the same language with values nested to any depth; one named
  rule per function (``fn_<i>``) and per parameter-name set (``key_<i>``), so the rules line up with
  structural roles.

Both allow at most one space after ``,`` and ``:`` and none elsewhere, which keeps greedy decoding
from running into whitespace. The EBNF form is the one to send: xgrammar compiles it in 0.1-0.3 s
with the default model's 151k-token vocabulary on a 2-core CPU, where the regex (its values
inlined at every use) takes 11 s for a one-function item and 450 s for a 37-function one. They do not enforce types, required parameters or no repeated
keyword: those are for the model to get right and for BFCL's checker to score.
:mod:`.strict_grammar` builds the schema-strict variant that does.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from sglang_pask.bfcl.data import BfclItem

_SEP = ", ?"
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}/-")
_STRING = r'("([^"\\\n]|\\[^\n])*"' + r"|'([^'\\\n]|\\[^\n])*')"
_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?"
_CONSTANT = "(True|False|None)"


def regex_escape(text: str) -> str:
    """Escape a literal for xgrammar's regex dialect.

    Parameters
    ----------
    text : str
        Literal text (e.g. a function name such as ``math.factorial``).

    Returns
    -------
    str
        A regex matching exactly ``text``.
    """
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


def _comma_list(element: str) -> str:
    return f"({element}({_SEP}{element})*)?"


def python_value_regex(depth: int = 2) -> str:
    """Regex of a Python literal value with containers nested at most ``depth`` levels.

    Parameters
    ----------
    depth : int
        Container nesting allowed: 0 gives scalars only, 1 lists/dicts of scalars, and so on.

    Returns
    -------
    str
        The regex (its size grows about 4x per level).

    Raises
    ------
    ValueError
        If ``depth`` is negative.
    """
    if depth < 0:
        raise ValueError(f"value depth must be >= 0, got {depth}")
    value = f"({_STRING}|{_NUMBER}|{_CONSTANT})"
    for _ in range(depth):
        inner = value
        list_ = rf"\[{_comma_list(inner)}\]"
        dict_ = rf"\{{{_comma_list(f'{_STRING}: ?{inner}')}\}}"
        value = f"({_STRING}|{_NUMBER}|{_CONSTANT}|{list_}|{dict_})"
    return value


def check_functions(functions: Sequence[dict[str, Any]]) -> None:
    """Raise ValueError unless ``functions`` is a non-empty list of BFCL function docs."""
    if not functions:
        raise ValueError("a call-list grammar needs at least one function")
    for function in functions:
        if not isinstance(function, dict) or "name" not in function or not isinstance(function.get("parameters"), dict):
            raise ValueError(f"not a BFCL function doc: {str(function)[:120]}")
        parameters = function["parameters"]
        if not isinstance(parameters.get("properties", {}), dict):
            raise ValueError(f"function {function['name']!r}: 'properties' must be an object")
        required = parameters.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise ValueError(f"function {function['name']!r}: 'required' must be a list of names")


def _parameter_names(function: dict[str, Any]) -> list[str]:
    return list(function["parameters"].get("properties", {}))


def call_list_regex(functions: Sequence[dict[str, Any]], value_depth: int = 2) -> str:
    """Regex of a BFCL answer for the given function docs.

    Parameters
    ----------
    functions : sequence of dict
        BFCL function docs (``name``, ``parameters.properties``).
    value_depth : int
        Container nesting allowed in argument values (see :func:`python_value_regex`); 2 covers
        every answer in BFCL's eight AST categories.

    Returns
    -------
    str
        A regex for SGLang's ``regex`` sampling param.

    Raises
    ------
    ValueError
        If ``functions`` is empty or not BFCL function docs.
    """
    check_functions(functions)
    value = python_value_regex(value_depth)
    calls = []
    for function in functions:
        names = _parameter_names(function)
        if names:
            keyword = "(" + "|".join(regex_escape(n) for n in names) + f")={value}"
            arguments = _comma_list(keyword)
        else:
            arguments = ""
        calls.append(rf"{regex_escape(function['name'])}\({arguments}\)")
    call = "(" + "|".join(calls) + ")"
    return rf"\[{call}({_SEP}{call})*\]"


def ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (xgrammar dialect)."""
    return json.dumps(text, ensure_ascii=False)


#: The rules of a Python literal value, shared with :mod:`.strict_grammar` (start rule ``value``).
EBNF_VALUE_RULES = r"""value ::= string | number | "True" | "False" | "None" | list | dict
list ::= "[" (value ("," " "? value)*)? "]"
dict ::= "{" (pair ("," " "? pair)*)? "}"
pair ::= string ":" " "? value
string ::= ("\"" ([^"\\\n] | "\\" [^\n])* "\"") | ("'" ([^'\\\n] | "\\" [^\n])* "'")
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?"""


def call_list_ebnf(functions: Sequence[dict[str, Any]]) -> str:
    """EBNF grammar (xgrammar dialect, start rule ``root``) of a BFCL answer.

    Parameters
    ----------
    functions : sequence of dict
        BFCL function docs (``name``, ``parameters.properties``).

    Returns
    -------
    str
        A grammar for SGLang's ``ebnf`` sampling param. Rules: ``root`` (the list), ``call``,
        ``fn_<i>`` (a call of function ``i``), ``key_<i>`` (a parameter name of function ``i``),
        ``value`` and its parts.

    Raises
    ------
    ValueError
        If ``functions`` is empty or not BFCL function docs.
    """
    check_functions(functions)
    lines = [
        'root ::= "[" call ("," " "? call)* "]"',
        "call ::= " + " | ".join(f"fn_{i}" for i in range(len(functions))),
    ]
    for i, function in enumerate(functions):
        names = _parameter_names(function)
        head = f"fn_{i} ::= {ebnf_literal(function['name'] + '(')}"
        if names:
            argument = f'key_{i} "=" value'
            lines.append(f'{head} ({argument} ("," " "? {argument})*)? ")"')
            lines.append(f"key_{i} ::= " + " | ".join(ebnf_literal(n) for n in names))
        else:
            lines.append(f'{head} ")"')
    lines.append(EBNF_VALUE_RULES)
    return "\n".join(lines)


def item_regex(item: BfclItem, value_depth: int = 2) -> str:
    """Regex constraint for an item's answer (see :func:`call_list_regex`).

    Parameters
    ----------
    item : BfclItem
        The item.
    value_depth : int
        Container nesting allowed in values.

    Returns
    -------
    str
        The regex.
    """
    return call_list_regex(item.functions, value_depth)


def item_ebnf(item: BfclItem) -> str:
    """EBNF constraint for an item's answer (see :func:`call_list_ebnf`).

    Parameters
    ----------
    item : BfclItem
        The item.

    Returns
    -------
    str
        The grammar.
    """
    return call_list_ebnf(item.functions)
