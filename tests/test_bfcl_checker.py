"""BFCL's AST checker path, offline, on real items with known-good and known-bad answers."""

from __future__ import annotations

import sys

import pytest

from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.data import AST_CATEGORIES, category_of, load_category, load_items
from sglang_pask.bfcl.oracle import oracle_answer

# The first two items of every category.
SAMPLE = [item for category in AST_CATEGORIES for item in load_category(category)[:2]]


def _item(item_id: str):
    (item,) = [it for it in load_items([category_of(item_id)]) if it.id == item_id]
    return item


@pytest.mark.parametrize("item", SAMPLE, ids=lambda it: it.id)
def test_oracle_answer_is_valid(item):
    result = check(item, oracle_answer(item))
    assert result.valid, (item.id, result.error)
    assert result.error_type == ""
    assert result.decoded is not None and len(result.decoded) == len(item.ground_truth)


def test_known_good_answers_in_model_style():
    item = _item("simple_python_0")  # calculate_triangle_area(base=10, height=5, unit optional)
    for text in (
        '[calculate_triangle_area(base=10, height=5, unit="units")]',
        "[calculate_triangle_area(base=10, height=5)]",
        "calculate_triangle_area(height=5, base=10)",  # BFCL adds the brackets itself
        "```\n[calculate_triangle_area(base=10, height=5, unit='units')]\n```",
    ):
        assert check(item, text).valid, text


@pytest.mark.parametrize(
    ("text", "error_type"),
    [
        ("[calculate_triangle_area(base=10, height=6)]", "value_error:others"),
        ("[calculate_triangle_area(base=10)]", "simple_function_checker:missing_required"),
        ("[triangle_area(base=10, height=5)]", "simple_function_checker:wrong_func_name"),
        ('[calculate_triangle_area(base="10", height=5)]', "type_error:simple"),
        ("[calculate_triangle_area(base=10, height=5, colour=1)]", "simple_function_checker:unexpected_param"),
        (
            "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=1, height=2)]",
            "simple_function_checker:wrong_count",
        ),
        ("The area is 25 square units.", "ast_decoder:decoder_failed"),
        ("[calculate_triangle_area(base=10, height=5", "ast_decoder:decoder_failed"),
        ("[10, 5]", "ast_decoder:decoder_failed"),
    ],
)
def test_known_bad_answers(text, error_type):
    result = check(_item("simple_python_0"), text)
    assert not result.valid
    assert result.error_type == error_type, result.error
    assert result.error


def test_parallel_accepts_any_order_and_rejects_a_missing_call():
    item = _item("parallel_0")
    answer = oracle_answer(item)
    calls = answer[1:-1].split("), ")
    assert len(calls) == 2
    swapped = f"[{calls[1].rstrip(')')}), {calls[0]})]"
    assert check(item, swapped).valid
    missing = f"[{calls[0]})]"
    result = check(item, missing)
    assert not result.valid and result.error_type == "parallel_function_checker_no_order:wrong_count"


def test_multiple_rejects_the_wrong_function_of_the_list():
    item = _item("multiple_0")
    other = next(f["name"] for f in item.functions if f["name"] not in item.ground_truth[0])
    result = check(item, f"[{other}()]")
    assert not result.valid


def test_checker_needs_none_of_bfcls_provider_dependencies():
    # The offline import must not have pulled in provider SDKs or left stand-ins for top-level names.
    for name in ("openai", "anthropic", "tenacity", "bfcl_eval.eval_checker.eval_runner"):
        module = sys.modules.get(name)
        assert module is None or "standins" not in getattr(module, "__name__", ""), name
    assert "bfcl_eval.model_handler.api_inference.openai_completion" not in sys.modules
    config = sys.modules["bfcl_eval.constants.model_config"]
    assert config.__name__ == "sglang_pask.bfcl.standins.model_config"
    assert config.MODEL_CONFIG_MAPPING["any/model"].underscore_to_dot is False


def test_oracle_pass_rate_over_all_categories():
    # BFCL's own ground truth, written as answers, passes its checker (a handful of answer-file
    # quirks aside, e.g. a `_from` keyword for a parameter named `from`).
    items = load_items()
    failures = [it.id for it in items if not check(it, oracle_answer(it)).valid]
    assert len(items) == 2351
    assert len(failures) <= 10, failures
