"""The layer-group pool on SGLang's triton attention backend, in real servers on the CPU.

Without a GPU, SGLang's triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), which
computes bf16 attention wrongly on a CPU, so every server here runs the tiny model in float32 (the
launcher refuses triton on a CPU otherwise). Checked, with greedy decoding:

* budget 1.0 (policy ``full``): sglang-pask's triton backend gives stock SGLang's triton outputs;
* pyramidkv at budget 0.33 (groups of different sizes, scores from the last-window queries): the
  triton backend keeps the same tokens and gives the same outputs as the torch_native backend, whose
  reads are tested against masked reference attention in ``test_layer_group_kv.py``;
* every group's allocator is back where it started afterwards, and nothing raised;
* the low-bit modes (``--kv-dropped k4v2 --kv-decode lowbit``, ``--kv-dropped 2bit --kv-decode keep``):
  decode reads the blocks through the fused kernel, extends with low-bit tokens in a cached prefix are
  gathered; outputs and kept sets (full-precision and low-bit positions) equal torch_native's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from test_layer_group_server import (
    SYSTEM,
    WORDS,
    generate,
    pool_usage,
    wait_idle_and_flush,
)

from sglang_pask.config import CONFIG_ENV
from sglang_pask.launch_server import cpu_defaults
from sglang_pask.server_process import ServerProcess

pytestmark = pytest.mark.server

INTERPRETER = {"TRITON_INTERPRET": "1"}
FLOAT32 = ["--dtype", "float32", "--constrained-json-disable-any-whitespace"]
GROUPS = ["--kv-layer-groups", "0-0,1-1", "--kv-window", "4"]
PYRAMID = ["--kv-policy", "pyramidkv", "--kv-budget", "0.33", "--chunked-prefill-size", "256", *GROUPS]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """Four servers, started one after the other (SGLang picks its internal ports at start-up):
    stock SGLang on triton, and sglang-pask with ``full`` on triton and with pyramidkv on triton and
    on torch_native."""
    logs = tmp_path_factory.mktemp("triton-logs")
    model = ["--model-path", str(tiny_model_dir), *FLOAT32]
    given = ("--attention-backend", "--dtype")
    stock_cpu = [arg for flag, flags in cpu_defaults() if flag not in given for arg in flags]
    plans = {
        "stock-triton": {
            "args": [*model, *stock_cpu, "--attention-backend", "triton"],
            "env": {"SGLANG_USE_CPU_ENGINE": "1", CONFIG_ENV: None, **INTERPRETER},
            "module": "sglang.launch_server",
        },
        "full-triton": {
            "args": [*model, "--attention-backend", "triton", "--kv-policy", "full", *GROUPS],
            "env": INTERPRETER,
        },
        "pyramid-triton": {"args": [*model, "--attention-backend", "triton", *PYRAMID], "env": INTERPRETER},
        "pyramid-torch": {"args": [*model, *PYRAMID]},
    }
    started: dict[str, ServerProcess] = {}
    try:
        for name, plan in plans.items():
            started[name] = ServerProcess(plan.pop("args"), logs / f"{name}.log", **plan)
            started[name].wait_ready(timeout_s=300)
        yield started
    finally:
        for server in started.values():
            server.stop()


def requests_to_compare() -> list[tuple[str, dict]]:
    """(prompt, sampling parameters): shared system prompt, JSON schema, regex (Triton's interpreter
    takes about a second per token here, so answers are short)."""
    long_text = " ".join(WORDS * 4)
    return [
        (SYSTEM + "Question: " + long_text, {"max_new_tokens": 12}),
        (SYSTEM + "Forecast for: " + long_text, {"max_new_tokens": 16, "json_schema": json.dumps(SCHEMA)}),
        (long_text + " Answer:", {"max_new_tokens": 8, "regex": "(yes|no)[0-9]{2}"}),
    ]


def answers(server: ServerProcess) -> list[tuple[list[int], dict]]:
    results = [generate(server, text, timeout=300, **params) for text, params in requests_to_compare()]
    return [(r["output_ids"], r["meta_info"]["kv_stats"]) for r in results]


def test_budget_one_on_triton_gives_stock_sglang_triton_outputs(servers):
    stock = [
        generate(servers["stock-triton"], text, timeout=300, **params)["output_ids"]
        for text, params in requests_to_compare()
    ]
    ours = answers(servers["full-triton"])
    assert [ids for ids, _ in ours] == stock
    assert all(len(ids) > 0 for ids in stock)
    for ids, stats in ours:
        assert stats["kept_tokens"] == [stats["full_tokens"]] * 2


def test_compressed_triton_keeps_and_answers_as_torch_native(servers):
    triton = answers(servers["pyramid-triton"])
    torch_native = answers(servers["pyramid-torch"])
    assert triton == torch_native
    for _, stats in triton:
        assert stats["policy"] == "pyramidkv"
    # The long prompts were compressed, differently per group (pyramid budgets).
    assert any(stats["kept_tokens"][0] > stats["kept_tokens"][1] for _, stats in triton)
    assert any(max(stats["kept_tokens"]) < stats["full_tokens"] for _, stats in triton)


def test_triton_servers_free_every_slot_and_never_raise(servers):
    for name in ("full-triton", "pyramid-triton"):
        server = servers[name]
        generate(server, SYSTEM + " ".join(WORDS), timeout=300, max_new_tokens=4)
        wait_idle_and_flush(server)
        usage = pool_usage(server)
        assert usage["tokens_in_use"] == 0 and [g["slots_in_use"] for g in usage["groups"]] == [0, 0]
        assert "Traceback" not in server.log_path.read_text(), server.log_tail(60)


LOWBIT_MODES = {
    "k4v2-lowbit": ["--kv-dropped", "k4v2", "--kv-decode", "lowbit"],
    "2bit-keep": ["--kv-dropped", "2bit", "--kv-decode", "keep"],
}


@pytest.mark.parametrize("mode", list(LOWBIT_MODES))
def test_low_bit_blocks_on_triton_keep_and_answer_as_torch_native(mode, tiny_model_dir, tmp_path):
    """Snapkv at 0.2 in full, the rest low-bit, on each backend in turn: a shared system prompt (its
    second use reads the first one's low-bit tokens from the radix cache, an extend over them) and an
    answer of 40 tokens (with ``lowbit``, the answer's older tokens go to a block after 32)."""
    flags = ["--model-path", str(tiny_model_dir), *FLOAT32, *GROUPS, "--kv-policy", "snapkv", "--kv-budget", "0.2"]
    prompts = [SYSTEM + " ".join(WORDS * 3), SYSTEM + "Question: " + " ".join(WORDS[:6])]
    results = {}
    for backend, extra, env in (("triton", ["--attention-backend", "triton"], INTERPRETER), ("torch", [], {})):
        server = ServerProcess([*flags, *LOWBIT_MODES[mode], *extra], tmp_path / f"{backend}.log", env=env)
        server.wait_ready(timeout_s=300)
        try:
            answers = [
                generate(server, text, timeout=600, max_new_tokens=40, ignore_eos=True, return_kv_kept=True)
                for text in prompts
            ]
            results[backend] = [(r["output_ids"], r["meta_info"]["kv_stats"]) for r in answers]
            wait_idle_and_flush(server)
            usage = pool_usage(server)
            assert usage["tokens_in_use"] == 0 and [g["slots_in_use"] for g in usage["groups"]] == [0, 0]
            assert "Traceback" not in server.log_path.read_text(), server.log_tail(60)
        finally:
            server.stop()
    assert results["triton"] == results["torch"]
    first, second = (stats for _, stats in results["triton"])
    assert all(count > 0 for count in first["lowbit_tokens"])  # the blocks were read in decode
    assert any(p < second["full_tokens"] for group in second["lowbit_positions"] for p in group)


GRAPH_DECODE_MODES = {
    # The fused low-bit kernel on the buffers; generated tokens packed into a block after the step.
    "k4v2-lowbit": ["--kv-policy", "snapkv", "--kv-budget", "0.2", "--kv-dropped", "k4v2", "--kv-decode", "lowbit"],
    # SGLang's decode kernel on the buffers; each layer's scores added in the buffers, the decode
    # compresses by them after the step (pyramidkv: groups of different budgets).
    "pyramidkv-compress": ["--kv-policy", "pyramidkv", "--kv-budget", "0.3"],
}


@pytest.mark.parametrize("mode", list(GRAPH_DECODE_MODES))
def test_decode_from_graph_buffers_keeps_and_answers_as_torch_native(mode, tiny_model_dir, tmp_path):
    """The CUDA-graph replay path without a GPU: with :data:`GRAPH_DECODE_ENV` set, every decode step
    on triton reads its groups' lists from the graph buffers, filled as before a replay, runs eagerly,
    and its groups keep, compress or pack after the step (the AFTER hook of ``ModelRunner.forward``).
    Two requests decode at once; outputs and kept sets equal torch_native's eager ones."""
    from concurrent.futures import ThreadPoolExecutor

    from sglang_pask.srt.attention.graph_reads import GRAPH_DECODE_ENV

    flags = ["--model-path", str(tiny_model_dir), *FLOAT32, *GROUPS, *GRAPH_DECODE_MODES[mode]]
    prompts = [SYSTEM + " ".join(WORDS * 3), "Question: " + " ".join(WORDS[:12])]
    results = {}
    for backend, extra, env in (
        ("triton", ["--attention-backend", "triton"], {**INTERPRETER, GRAPH_DECODE_ENV: "1"}),
        ("torch", [], {}),
    ):
        server = ServerProcess([*flags, *extra], tmp_path / f"{backend}.log", env=env)
        server.wait_ready(timeout_s=300)
        try:
            with ThreadPoolExecutor(len(prompts)) as pool:
                answers = list(
                    pool.map(
                        lambda text: generate(
                            server, text, timeout=600, max_new_tokens=40, ignore_eos=True, return_kv_kept=True
                        ),
                        prompts,
                    )
                )
            results[backend] = [(r["output_ids"], r["meta_info"]["kv_stats"]) for r in answers]
            wait_idle_and_flush(server)
            usage = pool_usage(server)
            assert usage["tokens_in_use"] == 0 and [g["slots_in_use"] for g in usage["groups"]] == [0, 0]
            assert "Traceback" not in server.log_path.read_text(), server.log_tail(60)
        finally:
            server.stop()
    assert results["triton"] == results["torch"]
    first, _ = (stats for _, stats in results["triton"])
    assert max(first["kept_tokens"]) < first["full_tokens"]  # the decode kept less than it read
    if mode == "k4v2-lowbit":
        assert all(count > 0 for count in first["lowbit_tokens"])
