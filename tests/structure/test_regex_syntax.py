"""The regex reader role analysis uses: the tree as written, Python's syntax errors."""

from __future__ import annotations

import re

import pytest

from sglang_pask.structure.grammar_info import analyze_regex
from sglang_pask.structure.regex_syntax import GROUP, REPEAT, RegexSyntaxError, literal_strings, parse


def test_literals_escapes_and_one_character_classes_join_one_run():
    assert parse(r"a\.b\(\n[(][\]]\x41\u00e9\0") == ["a.b(\n(]Aé\0"]


def test_classes_categories_anchors_and_lookarounds_match_no_fixed_character():
    assert parse(r"^[a-z]\d.(?=x)(?<!y)\1$") == [None] * 8
    assert parse(r"[]a][^]b]") == [None, None]  # a leading ] belongs to the class


def test_alternatives_stay_as_written():
    # Python's parser would hoist the common prefix "get_" out of the group
    assert parse("(get_a|get_b)") == [(GROUP, [["get_a"], ["get_b"]])]
    assert parse("a|") == [(GROUP, [["a"], []])]
    assert parse("(?:x)(?P<n>y)(?>z)") == [(GROUP, [["x"]]), (GROUP, [["y"]]), (GROUP, [["z"]])]


def test_quantifiers_bind_to_the_last_node():
    assert parse("xab?c") == ["xa", (REPEAT, 0, ["b"]), "c"]
    assert parse("(ab)+?c*+d{2,}e{,3}") == [
        (REPEAT, 1, [(GROUP, [["ab"]])]),
        (REPEAT, 0, ["c"]),
        (REPEAT, 2, ["d"]),
        (REPEAT, 0, ["e"]),
    ]
    assert parse("a{}b{x") == ["a{}b{x"]  # not quantifiers: literal braces, as in Python


@pytest.mark.parametrize(
    ("regex", "message"),
    [
        ("[a-", "unterminated character set"),
        ("(ab", "missing \\), unterminated subpattern"),
        ("ab)", "unbalanced parenthesis"),
        ("*a", "nothing to repeat"),
        ("^*", "nothing to repeat"),
        (r"a\b+", "nothing to repeat"),
        ("[]", "unterminated character set"),
        ("a|?", "nothing to repeat"),
        ("a**", "multiple repeat"),
        (r"\q", r"bad escape \\q"),
        ("a\\", "bad escape \\(end of pattern\\)"),
        (r"\x4", "incomplete escape"),
        ("(?Q)", "unknown extension"),
        ("(?x)a b", "verbose flag"),
    ],
)
def test_malformed_regexes_name_the_problem(regex, message):
    with pytest.raises(RegexSyntaxError, match=message) as err:
        parse(regex)
    assert isinstance(err.value, ValueError)
    if "verbose" not in message:  # Python refuses them too (the verbose flag it accepts)
        with pytest.raises(re.error):
            re.compile(regex)


def test_literal_strings_of_a_choice():
    assert literal_strings(parse('("c"|"f")')) == ['"c"', '"f"']
    assert literal_strings(parse("(a|b)[xy]")) is None
    assert literal_strings(parse("(a|b)(c|d)(e|f)"), limit=4) is None


def test_functions_sharing_a_prefix_keep_their_whole_names():
    # Python's parser hoists "weather.get_" out of the alternatives; the names must not lose it
    info = analyze_regex(r'\[(weather\.get_city\(city="[a-z]+"\)|weather\.get_zone\((zone=\d+)?\))\]')
    specs = {f.name: f for f in info.functions}
    assert set(specs) == {"weather.get_city", "weather.get_zone"}
    assert specs["weather.get_city"].required == {"city"}
    assert specs["weather.get_zone"].params == {"zone"} and not specs["weather.get_zone"].required
