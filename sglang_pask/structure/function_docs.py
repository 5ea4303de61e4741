"""Function docs (OpenAI ``tools`` entries, BFCL function docs) reduced to what roles need.

Accepted shapes: ``{"type": "function", "function": {...}}`` (OpenAI tool) and
``{"name": ..., "description": ..., "parameters": {...}}`` (OpenAI function, BFCL doc). BFCL writes
``"type": "dict"`` for objects; types do not matter here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FunctionSpec:
    """A callable function: its name, parameter names, required ones, and those with an enum."""

    name: str
    params: frozenset[str] = field(default_factory=frozenset)
    required: frozenset[str] = field(default_factory=frozenset)
    enums: frozenset[str] = field(default_factory=frozenset)


def function_doc(value: Any) -> Mapping[str, Any] | None:
    """The function object inside ``value`` if it is a tool / function doc, else None."""
    if not isinstance(value, Mapping):
        return None
    if value.get("type") == "function" and isinstance(value.get("function"), Mapping):
        value = value["function"]
    named = isinstance(value.get("name"), str) and isinstance(value.get("parameters", {}), Mapping)
    return value if named and ("parameters" in value or "description" in value) else None


def function_spec(doc: Any) -> FunctionSpec:
    """:class:`FunctionSpec` of one tool / function doc.

    Raises
    ------
    ValueError
        If ``doc`` is not a function doc, or its ``properties`` / ``required`` are malformed.
    """
    fn = function_doc(doc)
    if fn is None:
        raise ValueError(f"not a function doc (needs a string 'name' and 'parameters'): {doc!r:.200}")
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or []
    if not isinstance(props, Mapping):
        raise ValueError(f"function {fn['name']!r}: 'properties' must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"function {fn['name']!r}: 'required' must be a list of names")
    enums = {k for k, v in props.items() if isinstance(v, Mapping) and ("enum" in v or "const" in v)}
    return FunctionSpec(fn["name"], frozenset(props), frozenset(required), frozenset(enums))


def function_specs(docs: Iterable[Any]) -> tuple[FunctionSpec, ...]:
    """:func:`function_spec` of each doc."""
    return tuple(function_spec(d) for d in docs)
