"""Reference answers built from BFCL's possible-answer files.

An oracle answer takes, for every expected call, the first allowed value of each parameter (skipping
parameters whose only allowed value is ``""``, BFCL's mark for "may be omitted") and writes the calls
as a Python call list, ``[f(a=1, b="x"), g()]``. Used to check the grammar and the checker path
against BFCL's own ground truth; it is never shown to a model.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sglang_pask.bfcl.data import BfclItem

_OMIT = object()


def _first_allowed(candidates: Any) -> Any:
    if not isinstance(candidates, list):  # a few nested answers hold a bare value, not a list
        return candidates
    for candidate in candidates:
        if candidate != "":
            return _resolve(candidate)
    return _OMIT


def _resolve_dict(candidate: dict[str, list[Any]]) -> dict[str, Any]:
    resolved = {key: _first_allowed(allowed) for key, allowed in candidate.items()}
    return {key: value for key, value in resolved.items() if value is not _OMIT}


def _resolve(candidate: Any) -> Any:
    """Turn one allowed value into a concrete value (dicts in answers map keys to allowed lists)."""
    if isinstance(candidate, dict):
        return _resolve_dict(candidate)
    if isinstance(candidate, list):
        return [_resolve_dict(x) if isinstance(x, dict) else x for x in candidate]
    return candidate


def python_literal(value: Any) -> str:
    """Write a value as Python source, strings in double quotes.

    Parameters
    ----------
    value : str, int, float, bool, None, list or dict
        The value (nested containers allowed).

    Returns
    -------
    str
        Python source that evaluates to ``value``.

    Raises
    ------
    ValueError
        For a non-finite float or a type that has no literal here.
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no Python literal for {value!r}")
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no Python literal for a {type(value).__name__}")


def oracle_answer(item: BfclItem, declared_order: bool = False) -> str:
    """Build the reference answer of an item as BFCL's prompting format asks for it.

    Parameters
    ----------
    item : BfclItem
        The item.
    declared_order : bool
        Write each call's arguments in the order its function doc declares them (what
        :mod:`.strict_grammar` allows) instead of the possible answer's order.

    Returns
    -------
    str
        E.g. ``'[calculate_triangle_area(base=10, height=5, unit="units")]'``.
    """
    docs = {function["name"]: function for function in item.functions}
    calls = []
    for call in item.ground_truth:
        ((name, params),) = call.items()
        order = list(params)
        if declared_order:
            declared = list(docs[name]["parameters"].get("properties", {}))
            order.sort(key=lambda param: declared.index(param) if param in declared else len(declared))
        args = []
        for param in order:
            value = _first_allowed(params[param])
            if value is not _OMIT:
                args.append(f"{param}={python_literal(value)}")
        calls.append(f"{name}({', '.join(args)})")
    return "[" + ", ".join(calls) + "]"
