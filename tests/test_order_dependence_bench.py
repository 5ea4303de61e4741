"""``python -m bench.order_dependence``: counting and input checks (the servers run in the bench itself)."""

from __future__ import annotations

import pytest

from bench.order_dependence import changed, main


def test_changed_counts_the_pairs_whose_answer_differs_from_the_item_alone():
    answers = {
        "a": {"": "[f(x=1)]", "b": "[f(x=1)]", "c": "[f(x=1), f()]"},
        "b": {"": "[g()]", "a": "[g(y=2)]", "c": "[g()]"},
        "c": {"": "[h()]", "a": "[h()]", "b": "[h()]"},
    }
    assert changed(answers) == (2, 6)


def test_unknown_items_a_single_item_and_bad_numbers_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--items", "simple_python_3", "no_such_item_7"])
    assert exc.value.code == 2 and "unknown BFCL item ids ['no_such_item_7']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--items", "simple_python_3"])
    assert exc.value.code == 2 and "at least two items" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--budget", "1.5"])
    assert exc.value.code == 2 and "--budget must be in (0, 1], got 1.5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--max-tokens", "0"])
    assert exc.value.code == 2 and "--max-tokens must be at least 1, got 0" in capsys.readouterr().err
