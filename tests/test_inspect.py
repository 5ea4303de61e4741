"""``python -m sglang_pask.inspect``: renders every token with its role, in the terminal and as HTML."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sglang_pask.inspect import TaggedToken, render_html, render_terminal

TOKENS = [
    TaggedToken(1, "<|im_start|>", "template", True),
    TaggedToken(2, "Call <f>", "user_question", True),
    TaggedToken(3, "[", "boundary", False),
    TaggedToken(4, "f", "func_name", False),
    TaggedToken(5, "]", "boundary", False),
]


def test_terminal_rendering_marks_every_token_and_counts_roles():
    plain = render_terminal(TOKENS, colour=False)
    assert "[<|im_start|>|template][Call <f>|user_question]\n--- completion ---\n[[|boundary][f|func_name][]|boundary]" in plain
    assert "boundary: 2" in plain and "func_name: 1" in plain
    coloured = render_terminal(TOKENS, colour=True)
    assert coloured.count("\x1b[48;2;") == len(TOKENS) + 4  # one per token, one swatch per role


def test_html_page_has_one_span_per_token_escaped_with_role_tooltips():
    page = render_html(TOKENS, "t")
    assert page.count('class="t" style') == len(TOKENS) + 4  # tokens plus legend swatches
    assert "Call &lt;f&gt;" in page and 'title="func_name (id 4)"' in page
    assert "Prompt (2 tokens)" in page and "Completion (3 tokens)" in page


@pytest.mark.server
def test_cli_against_a_server_writes_the_page(tiny_server, tmp_path):
    out = tmp_path / "roles.html"
    result = subprocess.run(
        [
            sys.executable, "-m", "sglang_pask.inspect", "--url", tiny_server.url,
            "--messages", '[{"role": "user", "content": "Pick one."}]',
            "--regex", r"\[pick\(choice=(1|2)\)\]", "--html", str(out), "--no-color",
        ],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--- completion ---" in result.stdout and "|func_name]" in result.stdout
    page = out.read_text()
    prompt_count, completion_count = (int(n) for n in re.findall(r"\((\d+) tokens\)", page)[:2])
    assert prompt_count > 5 and completion_count >= 8
    assert page.count('class="t" style') > prompt_count + completion_count


def test_cli_reports_a_missing_server_clearly():
    result = subprocess.run(
        [sys.executable, "-m", "sglang_pask.inspect", "--url", "http://127.0.0.1:9", "--prompt", "x"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1 and "error: no server at http://127.0.0.1:9" in result.stderr
