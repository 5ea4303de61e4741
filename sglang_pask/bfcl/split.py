"""The fixed calibration / evaluation split of BFCL's eight AST categories, and id files.

Rule (version ``v1``): within each category, order the item ids by the SHA-256 of
``"sglang-pask-bfcl-split-v1:" + id`` and put the first ``max(1, round(0.1 * n))`` into the
calibration split; everything else is the evaluation split. The chosen ids are committed in
``calibration_ids.txt`` beside this module, and that file (not the rule) is what the harness and the
calibration command read, so the split cannot drift with a data or code change. ``python -m
sglang_pask.bfcl.split --check`` verifies the file against the rule; ``--write`` regenerates it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Iterable, Literal, Sequence

from sglang_pask.bfcl.data import AST_CATEGORIES, BfclItem, category_of, load_items

Split = Literal["eval", "calib"]
SPLITS: tuple[str, ...] = ("eval", "calib")
CALIBRATION_FRACTION = 0.1
CALIBRATION_IDS_PATH = Path(__file__).with_name("calibration_ids.txt")
_SALT = "sglang-pask-bfcl-split-v1:"


def _rank(item_id: str) -> str:
    return hashlib.sha256((_SALT + item_id).encode("utf-8")).hexdigest()


def compute_calibration_ids(items: Sequence[BfclItem]) -> list[str]:
    """Apply the split rule to items.

    Parameters
    ----------
    items : sequence of BfclItem
        Items of one or more categories.

    Returns
    -------
    list of str
        The calibration ids, category by category (in :data:`AST_CATEGORIES` order), each
        category's ids in rank order.
    """
    chosen: list[str] = []
    for category in AST_CATEGORIES:
        ids = sorted((it.id for it in items if it.category == category), key=_rank)
        if ids:
            chosen.extend(ids[: max(1, round(CALIBRATION_FRACTION * len(ids)))])
    return chosen


def read_ids_file(path: str | Path) -> list[str]:
    """Read an id file: one BFCL item id per line; blank lines and ``#`` comments are skipped.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.

    Returns
    -------
    list of str
        The ids in file order, without duplicates.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it lists no id, or an id of no AST category.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"id file not found: {path}")
    ids: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            category_of(text)  # raises on an id of no AST category
            ids.append(text)
    if not ids:
        raise ValueError(f"id file {path} lists no item id")
    return list(dict.fromkeys(ids))


def load_calibration_ids() -> frozenset[str]:
    """Return the committed calibration ids.

    Returns
    -------
    frozenset of str
        The ids in ``calibration_ids.txt``.
    """
    return frozenset(read_ids_file(CALIBRATION_IDS_PATH))


def split_items(items: Iterable[BfclItem], split: Split) -> list[BfclItem]:
    """Keep the items of one split.

    Parameters
    ----------
    items : iterable of BfclItem
        Candidate items.
    split : {"eval", "calib"}
        ``"calib"`` keeps the committed calibration ids, ``"eval"`` everything else.

    Returns
    -------
    list of BfclItem
        The kept items, in the given order.

    Raises
    ------
    ValueError
        For an unknown split name.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    calibration = load_calibration_ids()
    return [it for it in items if (it.id in calibration) == (split == "calib")]


def select_by_ids(items: Iterable[BfclItem], ids: Sequence[str]) -> list[BfclItem]:
    """Keep exactly the given ids, in the given order.

    Parameters
    ----------
    items : iterable of BfclItem
        Candidate items (must include every requested id).
    ids : sequence of str
        Wanted ids.

    Returns
    -------
    list of BfclItem
        One item per id.

    Raises
    ------
    ValueError
        If an id is not among ``items``.
    """
    by_id = {it.id: it for it in items}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"{len(missing)} id(s) not found in the loaded categories, e.g. {missing[:3]}")
    return [by_id[i] for i in ids]


def render_calibration_file(ids: Sequence[str]) -> str:
    """Render the content of ``calibration_ids.txt``.

    Parameters
    ----------
    ids : sequence of str
        Calibration ids as :func:`compute_calibration_ids` returns them.

    Returns
    -------
    str
        The file text (header comment, then one id per line).
    """
    header = [
        "# BFCL calibration split (rule v1, see sglang_pask/bfcl/split.py): per AST category, the",
        f"# first max(1, round({CALIBRATION_FRACTION} * n)) ids ordered by sha256('{_SALT}' + id).",
        "# The evaluation split is every other item of the eight categories. Generated by",
        "# `python -m sglang_pask.bfcl.split --write`; do not edit by hand.",
    ]
    return "\n".join(header + list(ids)) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Check or regenerate ``calibration_ids.txt`` against the rule.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments (``--check`` or ``--write``).

    Returns
    -------
    int
        0 when the file matches (or was written), 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m sglang_pask.bfcl.split", description=main.__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="verify the committed file")
    action.add_argument("--write", action="store_true", help="regenerate the committed file")
    args = parser.parse_args(argv)
    text = render_calibration_file(compute_calibration_ids(load_items()))
    if args.write:
        CALIBRATION_IDS_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {CALIBRATION_IDS_PATH}")
        return 0
    if CALIBRATION_IDS_PATH.is_file() and CALIBRATION_IDS_PATH.read_text(encoding="utf-8") == text:
        print(f"{CALIBRATION_IDS_PATH} matches the rule")
        return 0
    print(f"{CALIBRATION_IDS_PATH} differs from the rule; run with --write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
