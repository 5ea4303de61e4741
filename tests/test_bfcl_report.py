"""Paired differences between BFCL configurations (:mod:`sglang_pask.bfcl.report`), on synthetic verdicts."""

from __future__ import annotations

import random

import pytest

from sglang_pask.bfcl.report import ConfigResult, ItemResult, format_differences, paired_differences


def config(policy: str, budget: float, verdicts: dict[str, list[bool]]) -> ConfigResult:
    """A configuration whose answers to ``category_i`` are ``verdicts[category][i]``."""
    items = [
        ItemResult(
            id=f"{category}_{i}",
            category=category,
            output="",
            valid=valid,
            error_type="",
            latency_s=0.0,
            prompt_tokens=1,
            completion_tokens=1,
            finish_reason="stop",
        )
        for category, column in verdicts.items()
        for i, valid in enumerate(column)
    ]
    return ConfigResult(policy, budget, items)


def random_verdicts(rng: random.Random, sizes: dict[str, int], rate: float) -> dict[str, list[bool]]:
    return {category: [rng.random() < rate for _ in range(n)] for category, n in sizes.items()}


SIZES = {"simple_python": 30, "multiple": 20, "live_parallel": 7}


def test_a_configuration_equal_to_the_reference_differs_by_exactly_zero():
    verdicts = random_verdicts(random.Random(), SIZES, 0.5)
    reference, same = config("full", 1.0, verdicts), config("pask", 0.3, verdicts)
    (difference,) = paired_differences([same], reference, resamples=500)
    assert (difference.points, difference.low, difference.high) == (0.0, 0.0, 0.0)
    assert (difference.label, difference.reference) == ("pask@0.3", "full@1")


def test_the_point_difference_is_the_difference_of_the_category_means():
    rng = random.Random()
    reference = config("full", 1.0, random_verdicts(rng, SIZES, 0.6))
    others = [
        config("snapkv", 0.3, random_verdicts(rng, SIZES, 0.3)),
        config("pask", 0.3, random_verdicts(rng, SIZES, 0.5)),
    ]
    for other, difference in zip(others, paired_differences(others, reference, resamples=2000)):
        assert difference.points == pytest.approx(other.average() - reference.average())
        assert difference.low <= difference.points <= difference.high


def test_all_right_against_all_wrong_is_one_hundred_points_on_every_resample():
    right = config("pask", 0.3, {c: [True] * n for c, n in SIZES.items()})
    wrong = config("full", 1.0, {c: [False] * n for c, n in SIZES.items()})
    (difference,) = paired_differences([right], wrong, resamples=300)
    assert (difference.points, difference.low, difference.high) == pytest.approx((100.0, 100.0, 100.0))


def test_pairing_keeps_a_one_item_gain_from_ever_looking_like_a_loss():
    # Same answers but for one item the configuration gets right and the reference does not: every
    # resample that draws that item shows a gain, none a loss. An unpaired comparison of two
    # half-right configurations would put much of its interval below zero.
    rng = random.Random()
    base = random_verdicts(rng, {"simple_python": 40, "multiple": 40}, 0.5)
    base["multiple"][0] = False
    better = {c: list(v) for c, v in base.items()}
    better["multiple"][0] = True
    (difference,) = paired_differences([config("pask", 0.3, better)], config("full", 1.0, base), resamples=4000)
    assert difference.points == pytest.approx(100.0 / 40 / 2)
    assert difference.low == 0.0 and 0.0 < difference.high < 5 * difference.points


def test_the_interval_narrows_as_items_are_added_and_a_seed_reproduces_it():
    rng = random.Random()
    widths = []
    for n in (8, 200):
        sizes = {"simple_python": n, "parallel": n}
        reference = config("full", 1.0, random_verdicts(rng, sizes, 0.6))
        other = config("snapkv", 0.3, random_verdicts(rng, sizes, 0.4))
        first = paired_differences([other], reference, resamples=3000, seed=7)
        assert paired_differences([other], reference, resamples=3000, seed=7) == first
        widths.append(first[0].high - first[0].low)
    assert widths[1] < widths[0] / 2


def test_configurations_over_other_items_or_bad_settings_are_refused():
    reference = config("full", 1.0, {"simple_python": [True, False]})
    fewer = config("pask", 0.3, {"simple_python": [True]})
    with pytest.raises(ValueError, match="did not answer the same items"):
        paired_differences([fewer], reference)
    for resamples, level in ((0, 0.95), (100, 1.0), (100, 0.0)):
        with pytest.raises(ValueError, match="resamples >= 1 and level in"):
            paired_differences([reference], reference, resamples=resamples, level=level)


def test_the_table_has_a_column_per_reference_and_no_self_comparison():
    verdicts = {"simple_python": [True, False, True, True], "multiple": [False, True, False, False]}
    full = config("full", 1.0, verdicts)
    weaker = config("snapkv", 0.3, {"simple_python": [True, False, False, False], "multiple": [False] * 4})
    table = format_differences([full, weaker], [full, weaker]).splitlines()
    assert table[0] == "| config | minus full@1 | minus snapkv@0.3 |"
    assert (
        table[2].startswith("| full@1 | - | +")
        and table[3].startswith("| snapkv@0.3 | -")
        and table[3].endswith(" | - |")
    )
    assert "-37.5 [" in table[3]  # (25 - 75) / 2 + (0 - 25) / 2
