"""The answer constraints a BFCL request can carry, by name (``--grammar`` of the bench and calibration).

- ``ebnf``: :func:`.grammar.item_ebnf`, the call list over the item's functions, loose arguments;
- ``ebnf-strict``: :func:`.strict_grammar.strict_call_list_ebnf`, the function docs enforced as strict tools;
- ``regex``: :func:`.grammar.item_regex`, the language of ``ebnf`` as a regex (slow to compile);
- ``none``: no constraint.
"""

from __future__ import annotations

from typing import Callable

from sglang_pask.bfcl.data import BfclItem
from sglang_pask.bfcl.grammar import item_ebnf, item_regex
from sglang_pask.bfcl.strict_grammar import strict_call_list_ebnf

#: Each grammar: the SGLang sampling param that carries it and the builder of its text.
_GRAMMARS: dict[str, tuple[str, Callable[[BfclItem], str]]] = {
    "ebnf": ("ebnf", item_ebnf),
    "ebnf-strict": ("ebnf", lambda item: strict_call_list_ebnf(item.functions)),
    "regex": ("regex", item_regex),
}
#: Every constraint name, the default first.
CONSTRAINTS: tuple[str, ...] = (*_GRAMMARS, "none")


def answer_constraint(item: BfclItem, name: str) -> dict[str, str]:
    """The sampling params that constrain an item's answer.

    Parameters
    ----------
    item : BfclItem
        The item.
    name : str
        One of :data:`CONSTRAINTS`.

    Returns
    -------
    dict
        ``{param: grammar text}`` (e.g. ``{"ebnf": ...}``), empty for ``"none"``.

    Raises
    ------
    ValueError
        If ``name`` is not a constraint.
    """
    if name == "none":
        return {}
    if name not in _GRAMMARS:
        raise ValueError(f"unknown answer constraint {name!r}; choose from {', '.join(CONSTRAINTS)}")
    param, build = _GRAMMARS[name]
    return {param: build(item)}
