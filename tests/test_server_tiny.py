"""Real SGLang server processes started by ``sglang_pask.launch_server`` on the tiny random model.

The model's text is meaningless; these tests check serving mechanics: grammars hold, the OpenAI
tools path returns tool calls, greedy decoding equals Hugging Face transformers, the frontend runs,
and the config given on the command line is the one the spawned scheduler process sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[1]


def generate(server, text: str, **sampling) -> dict:
    response = requests.post(
        f"{server.url}/generate",
        json={"text": text, "sampling_params": {"temperature": 0, **sampling}},
        timeout=120,
    )
    response.raise_for_status()
    return response.json()


def test_scheduler_process_sees_the_command_line_config(tiny_server, tiny_server_flags):
    info = requests.get(f"{tiny_server.url}/server_info", timeout=30).json()
    seen = info["internal_states"][0]["sglang_pask"]
    flags = dict(zip(tiny_server_flags[::2], tiny_server_flags[1::2]))
    assert seen["kv_policy"] == flags["--kv-policy"]
    assert seen["kv_budget"] == float(flags["--kv-budget"])
    assert seen["kv_layer_groups"] == flags["--kv-layer-groups"]
    # Reported from inside the scheduler: a spawned process, not the launcher we started.
    assert seen["pid"] != tiny_server.process.pid
    assert info["device"] == "cpu" and info["attention_backend"] == "torch_native"


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text": ""}, "the prompt is empty"),
        ({"input_ids": []}, "empty"),  # SGLang's own check ("input_ids cannot be empty.")
        ({"input_ids": [5, 10**9]}, "outside the model's vocabulary"),
        ({"input_ids": [-1, 5]}, "outside the model's vocabulary"),
    ],
)
def test_prompts_the_engine_would_die_on_are_a_clear_400_and_the_server_lives_on(tiny_server, body, message):
    # Stock SGLang 0.5.23 accepts the empty text and the out-of-vocabulary ids, then its scheduler dies.
    response = requests.post(
        f"{tiny_server.url}/generate", json={**body, "sampling_params": {"max_new_tokens": 4}}, timeout=120
    )
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert generate(tiny_server, "still alive ", max_new_tokens=2)["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 4}]},
            "sampling_params has 1 entries but the batch has 2 prompts (text)",
        ),
        ({"text": ["a"], "sampling_params": []}, "sampling_params has 0 entries but the batch has 1 prompts"),
        (
            {"input_ids": [[11, 12], [13]], "sampling_params": [{"max_new_tokens": 2}]},
            "sampling_params has 1 entries but the batch has 2 prompts (input_ids)",
        ),
        ({"text": "a", "sampling_params": [{"max_new_tokens": 2}]}, "sampling_params is a list, but the request"),
        ({"text": ["a", "b"], "return_logprob": [True]}, "return_logprob has 1 entries but the batch has 2"),
    ],
)
def test_per_prompt_lists_that_do_not_fit_the_batch_are_a_clear_400(tiny_server, body, message):
    # SGLang 0.5.23 indexed them without a length check: HTTP 500 and an IndexError (issue 51, problem 1).
    response = requests.post(f"{tiny_server.url}/generate", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"], response.text
    assert generate(tiny_server, "still alive ", max_new_tokens=2)["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/generate", '{"text": "a", ', "request body is not valid JSON at character 14: unexpected end of data"),
        ("/v1/chat/completions", '{"model": "x", ', "request body is not valid JSON at character 15"),
        ("/v1/completions", "[1,2", "request body is not valid JSON at character 4"),
        ("/generate", '{"text": "a", "sampling_params": {"regex": "("}}', "Regex parsing error at position 2"),
    ],
)
def test_error_bodies_name_the_problem_not_the_servers_files(tiny_server, path, body, message):
    # The JSON decode error named http_server.py and its line; xgrammar's named its C++ file (problem 5).
    response = requests.post(
        f"{tiny_server.url}{path}", data=body, headers={"content-type": "application/json"}, timeout=120
    )
    assert response.status_code == 400, response.text
    assert message in response.text
    assert not re.search(r"File \"|\.py\b|\.cc\b|line \d+", response.text), response.text


def test_generate_with_regex(tiny_server):
    pattern = r"(yes|no)[0-9]{2}"
    out = generate(tiny_server, "Answer: ", regex=pattern, max_new_tokens=16)
    assert re.fullmatch(pattern, out["text"]), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_generate_with_json_schema(tiny_server):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "color": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["ok", "color"],
        "additionalProperties": False,
    }
    out = generate(tiny_server, "Give me JSON: ", json_schema=json.dumps(schema), max_new_tokens=64)
    value = json.loads(out["text"])
    assert isinstance(value["ok"], bool) and value["color"] in ("red", "blue") and set(value) == {"ok", "color"}


def test_chat_completion_with_a_tool_schema(tiny_server):
    tool = {
        "type": "function",
        "function": {
            "name": "set_unit",
            "description": "Choose a unit.",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["unit"],
            },
        },
    }
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Use celsius please."}],
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 64,
    }
    response = requests.post(f"{tiny_server.url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    # No tool-call parser on this server: SGLang constrains the reply with the JSON schema of a list
    # of calls to the offered tools ({"name", "parameters"}) and returns it as the content.
    calls = json.loads(choice["message"]["content"])
    assert len(calls) >= 1
    for call in calls:
        assert call["name"] == "set_unit"
        assert call["parameters"]["unit"] in ("celsius", "fahrenheit")


def test_greedy_output_equals_transformers(tiny_server, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "def forward(self, x):"
    out = generate(tiny_server, prompt, max_new_tokens=8, ignore_eos=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    ids = tokenizer(prompt)["input_ids"]
    expected = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    assert out["output_ids"] == expected


def test_frontend_regex_program_runs_against_the_server(tiny_server):
    result = subprocess.run(
        [sys.executable, str(REPO / "frontend_examples" / "regex_gen.py"), "--url", tiny_server.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"])
    assert re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", record["version"])
    assert record["security_fix"] in ("yes", "no")


def test_a_paused_server_is_frozen_whole_and_answers_again_after_resume(tiny_server):
    import psutil

    group = [psutil.Process(tiny_server.process.pid), *psutil.Process(tiny_server.process.pid).children(recursive=True)]
    assert len(group) >= 3  # launcher (tokenizer manager), scheduler, detokenizer
    tiny_server.pause()
    try:
        deadline = time.monotonic() + 10  # a stop is delivered asynchronously
        while {p.status() for p in group} != {psutil.STATUS_STOPPED} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p.status() for p in group} == {psutil.STATUS_STOPPED}, [(p.pid, p.status()) for p in group]
        with pytest.raises(requests.exceptions.Timeout):
            requests.get(f"{tiny_server.url}/health", timeout=2)
    finally:
        tiny_server.resume()
    assert psutil.STATUS_STOPPED not in {p.status() for p in group}
    out = generate(tiny_server, "Answer: ", regex="(yes|no)", max_new_tokens=4)
    assert out["text"] in ("yes", "no")
