"""Questions and possible answers of BFCL's eight AST categories, read from the installed
``bfcl_eval`` package (``bfcl-eval==2026.3.23``, BFCL v4 data).

Each file ``bfcl_eval/data/BFCL_v4_<category>.json`` holds one JSON object per line (despite the
name); the possible answers are in ``bfcl_eval/data/possible_answer/`` in the same order. Items are
returned raw, as BFCL stores them: prompt pre-processing lives in :mod:`sglang_pask.bfcl.prompt`.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

#: The eight AST categories of the PASK paper, in BFCL's order.
AST_CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)

_VERSION_PREFIX = "BFCL_v4"


@dataclass(frozen=True)
class BfclItem:
    """One BFCL test item with its possible answer.

    Attributes
    ----------
    id : str
        BFCL's id, e.g. ``"simple_python_0"`` or ``"live_multiple_3-1-0"``.
    category : str
        One of :data:`AST_CATEGORIES`.
    messages : list of dict
        The question as chat messages (``role``, ``content``); some live items start with a system
        message. All AST categories are single-turn.
    functions : list of dict
        The function docs (``name``, ``description``, ``parameters``) exactly as BFCL stores them.
    ground_truth : list of dict
        BFCL's possible answer: one ``{function_name: {param: [allowed values]}}`` per expected call,
        where ``""`` among the allowed values marks an optional parameter.
    """

    id: str
    category: str
    messages: list[dict[str, str]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]]

    def copy_functions(self) -> list[dict[str, Any]]:
        """Return a deep copy of the function docs (BFCL's pre-processing mutates them).

        Returns
        -------
        list of dict
            An independent copy of :attr:`functions`.
        """
        return copy.deepcopy(self.functions)


def data_dir() -> Path:
    """Return the folder that holds BFCL's question files.

    Returns
    -------
    pathlib.Path
        ``<site-packages>/bfcl_eval/data``.

    Raises
    ------
    ImportError
        If ``bfcl_eval`` is not installed.
    """
    try:
        root = importlib.resources.files("bfcl_eval")
    except ModuleNotFoundError as exc:
        raise ImportError(
            "bfcl_eval is not installed: run `pip install --no-deps -r requirements/bfcl-nodeps.txt`"
        ) from exc
    return Path(str(root)) / "data"


def check_categories(categories: Iterable[str]) -> tuple[str, ...]:
    """Validate category names.

    Parameters
    ----------
    categories : iterable of str
        Names to check.

    Returns
    -------
    tuple of str
        The names, in the given order, without duplicates.

    Raises
    ------
    ValueError
        If a name is not one of :data:`AST_CATEGORIES`, or none is given.
    """
    names = tuple(dict.fromkeys(categories))
    unknown = [name for name in names if name not in AST_CATEGORIES]
    if unknown:
        raise ValueError(f"unknown BFCL category {', '.join(unknown)}; choose from {', '.join(AST_CATEGORIES)}")
    if not names:
        raise ValueError("no BFCL category given")
    return names


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def _load_category(category: str) -> tuple[BfclItem, ...]:
    folder = data_dir()
    questions = _read_jsonl(folder / f"{_VERSION_PREFIX}_{category}.json")
    answers = _read_jsonl(folder / "possible_answer" / f"{_VERSION_PREFIX}_{category}.json")
    by_id = {answer["id"]: answer["ground_truth"] for answer in answers}
    items = []
    for entry in questions:
        if entry["id"] not in by_id:
            raise ValueError(f"{category}: no possible answer for {entry['id']}")
        if len(entry["question"]) != 1:
            raise ValueError(f"{entry['id']}: expected a single-turn question")
        items.append(
            BfclItem(
                id=entry["id"],
                category=category,
                messages=entry["question"][0],
                functions=entry["function"],
                ground_truth=by_id[entry["id"]],
            )
        )
    return tuple(items)


def load_category(category: str) -> list[BfclItem]:
    """Load every item of one AST category, in file order.

    Parameters
    ----------
    category : str
        One of :data:`AST_CATEGORIES`.

    Returns
    -------
    list of BfclItem
        The category's items (shared, cached objects: do not mutate them).
    """
    (name,) = check_categories([category])
    return list(_load_category(name))


def load_items(categories: Sequence[str] = AST_CATEGORIES) -> list[BfclItem]:
    """Load the items of several categories, category by category in the given order.

    Parameters
    ----------
    categories : sequence of str
        Category names (default: all eight AST categories).

    Returns
    -------
    list of BfclItem
        All their items.
    """
    return [item for category in check_categories(categories) for item in _load_category(category)]


def category_of(item_id: str) -> str:
    """Return the AST category that an item id belongs to.

    Parameters
    ----------
    item_id : str
        A BFCL id such as ``"parallel_multiple_12"`` or ``"live_simple_3-2-0"``.

    Returns
    -------
    str
        Its category (the longest category name that prefixes the id followed by ``_``).

    Raises
    ------
    ValueError
        If the id belongs to none of :data:`AST_CATEGORIES`.
    """
    matches = [c for c in AST_CATEGORIES if item_id.startswith(c + "_")]
    if not matches:
        raise ValueError(f"{item_id!r} is not an id of the AST categories")
    return max(matches, key=len)
