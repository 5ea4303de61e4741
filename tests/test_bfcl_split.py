"""The calibration / evaluation split and id-file selection are fixed and deterministic."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.bfcl import configurations, parse_budgets, select_items
from sglang_pask.bfcl.data import AST_CATEGORIES, category_of, check_categories, load_items
from sglang_pask.bfcl.split import (
    CALIBRATION_IDS_PATH,
    compute_calibration_ids,
    load_calibration_ids,
    read_ids_file,
    render_calibration_file,
    split_items,
)


def test_committed_file_matches_the_rule():
    items = load_items()
    assert CALIBRATION_IDS_PATH.read_text(encoding="utf-8") == render_calibration_file(compute_calibration_ids(items))


def test_splits_are_disjoint_and_cover_every_item_with_about_ten_percent_per_category():
    items = load_items()
    calib, evaluation = split_items(items, "calib"), split_items(items, "eval")
    calib_ids, eval_ids = {it.id for it in calib}, {it.id for it in evaluation}
    assert not calib_ids & eval_ids
    assert calib_ids | eval_ids == {it.id for it in items}
    assert calib_ids == load_calibration_ids()
    sizes, per_category = Counter(it.category for it in items), Counter(it.category for it in calib)
    for category in AST_CATEGORIES:
        assert per_category[category] == max(1, round(0.1 * sizes[category])), category


def test_rule_is_independent_of_item_order():
    items = load_items()
    assert compute_calibration_ids(items) == compute_calibration_ids(list(reversed(items)))


def test_split_then_limit_is_deterministic():
    calibration = load_calibration_ids()
    expected = [it.id for c in ("parallel", "live_simple") for it in load_items([c]) if it.id not in calibration]
    expected = expected[:3] + [i for i in expected if i.startswith("live_simple")][:3]
    first = select_items(["parallel", "live_simple"], "eval", None, 3)
    second = select_items(["parallel", "live_simple"], "eval", None, 3)
    assert [it.id for it in first] == [it.id for it in second] == expected
    calib = select_items(["parallel"], "calib", None, 50)
    assert {it.id for it in calib} == {i for i in calibration if category_of(i) == "parallel"}


def test_ids_file_selects_exactly_those_ids_in_file_order(tmp_path):
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# a comment\nmultiple_7\n\nsimple_python_3  # trailing comment\nmultiple_7\n")
    assert read_ids_file(ids_file) == ["multiple_7", "simple_python_3"]
    chosen = select_items(list(AST_CATEGORIES), None, str(ids_file), None)
    assert [it.id for it in chosen] == ["multiple_7", "simple_python_3"]


def test_ids_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_ids_file(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError):
        read_ids_file(empty)
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("irrelevance_3\n")
    with pytest.raises(ValueError):
        read_ids_file(foreign)
    outside = tmp_path / "outside.txt"
    outside.write_text("multiple_7\n")
    with pytest.raises(ValueError, match="not found"):
        select_items(["simple_python"], None, str(outside), None)


def test_bad_categories_splits_and_budgets_are_rejected():
    with pytest.raises(ValueError, match="unknown BFCL category"):
        check_categories(["simple_java"])
    with pytest.raises(ValueError):
        split_items(load_items(["parallel"]), "test")
    with pytest.raises(ValueError):
        select_items(["parallel"], None, None, 0)
    for bad in (["0"], ["1.5"], ["x"], []):
        with pytest.raises(ValueError):
            parse_budgets(bad)
    assert parse_budgets(["0.33,0.2", "0.33"]) == [0.33, 0.2]
    assert configurations(["full", "pask"], [0.33, 0.2]) == [("full", 1.0), ("pask", 0.33), ("pask", 0.2)]


def test_category_of_prefers_the_longest_category_name():
    assert category_of("parallel_multiple_12") == "parallel_multiple"
    assert category_of("live_parallel_multiple_0-0-0") == "live_parallel_multiple"
    assert category_of("live_multiple_3-1-0") == "live_multiple"
    with pytest.raises(ValueError):
        category_of("simple_java_1")
