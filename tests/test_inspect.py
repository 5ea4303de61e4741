"""``python -m sglang_pask.inspect``: renders every token with its role, in the terminal and as HTML."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sglang_pask.inspect import EVICTED, FULL, LOW_BIT, TaggedToken, render_html, render_terminal, tiers_by_position

TOKENS = [
    TaggedToken(1, "<|im_start|>", "template", True),
    TaggedToken(2, "Call <f>", "user_question", True),
    TaggedToken(3, "[", "boundary", False),
    TaggedToken(4, "f", "func_name", False),
    TaggedToken(5, "]", "boundary", False),
]


def test_terminal_rendering_marks_every_token_and_counts_roles():
    plain = render_terminal(TOKENS, colour=False)
    assert (
        "[<|im_start|>|template][Call <f>|user_question]\n--- completion ---\n[[|boundary][f|func_name][]|boundary]"
        in plain
    )
    assert "boundary: 2" in plain and "func_name: 1" in plain
    coloured = render_terminal(TOKENS, colour=True)
    assert coloured.count("\x1b[48;2;") == len(TOKENS) + 4  # one per token, one swatch per role


def test_html_page_has_one_span_per_token_escaped_with_role_tooltips():
    page = render_html(TOKENS, "t")
    assert page.count('class="t" style') == len(TOKENS) + 4  # tokens plus legend swatches
    assert "Call &lt;f&gt;" in page and 'title="func_name (id 4)"' in page
    assert "Prompt (2 tokens)" in page and "Completion (3 tokens)" in page


def test_kept_and_low_bit_positions_become_per_group_tiers_and_the_unwritten_last_token_none():
    assert tiers_by_position(None, None, 3) == [None, None, None]
    assert tiers_by_position([[0, 2, 3], [1, 2, 3]], None, 5) == [
        (FULL, EVICTED),
        (EVICTED, FULL),
        (FULL, FULL),
        (FULL, FULL),
        None,
    ]
    assert tiers_by_position([[2], [2]], [[0], [0, 1]], 4) == [
        (LOW_BIT, LOW_BIT),
        (EVICTED, LOW_BIT),
        (FULL, FULL),
        None,
    ]


def test_tiers_are_marked_in_both_renderings():
    tokens = [
        TaggedToken(1, "keep", "user_question", True, (FULL, FULL)),
        TaggedToken(2, "half", "system_text", True, (FULL, EVICTED)),
        TaggedToken(3, "gone", "system_text", True, (EVICTED, EVICTED)),
        TaggedToken(4, "low", "schema_description", True, (LOW_BIT, EVICTED)),
        TaggedToken(5, "x", "free_text", False, None),
    ]
    plain = render_terminal(tokens, colour=False)
    assert "[keep|user_question][half|system_text|tiers:F-][gone|system_text|tiers:--]" in plain
    assert "[low|schema_description|tiers:L-]" in plain
    assert "1 tokens evicted by every layer group" in plain and "1 tokens at low bits" in plain
    coloured = render_terminal(tokens, colour=True)
    assert coloured.count("\x1b[9m") == 1 and coloured.count("\x1b[4m") == 1 and "(struck through)" in coloured
    page = render_html(tokens, "t")
    assert page.count("line-through") == 1 and page.count("underline dotted") == 1
    assert "opacity:0.60" in page and "opacity:0.20" in page and "opacity:0.40" in page
    assert 'title="system_text (id 3), evicted in 0, 1 (of 2 layer groups)"' in page
    assert 'title="schema_description (id 4), low-bit in 0; evicted in 1 (of 2 layer groups)"' in page
    assert "<th>group 1: full / low-bit</th>" in page
    assert "system_text</span></td><td>2</td><td>1 / 0</td><td>0 / 0</td>" in page


@pytest.mark.server
def test_cli_against_a_server_writes_the_page(tiny_server, tmp_path):
    out = tmp_path / "roles.html"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_pask.inspect",
            "--url",
            tiny_server.url,
            "--messages",
            '[{"role": "user", "content": "Pick one."}]',
            "--regex",
            r"\[pick\(choice=(1|2)\)\]",
            "--html",
            str(out),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--- completion ---" in result.stdout and "|func_name]" in result.stdout
    page = out.read_text()
    prompt_count, completion_count = (int(n) for n in re.findall(r"\((\d+) tokens\)", page)[:2])
    assert prompt_count > 5 and completion_count >= 8
    assert page.count('class="t" style') > prompt_count + completion_count
    # The full-KV server keeps everything: nothing is marked, every group counts every token.
    assert "|tiers:" not in result.stdout and "line-through" not in page and "group 1: full / low-bit" in page


def test_cli_reports_a_missing_server_clearly():
    result = subprocess.run(
        [sys.executable, "-m", "sglang_pask.inspect", "--url", "http://127.0.0.1:9", "--prompt", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "error: no server at http://127.0.0.1:9" in result.stderr
