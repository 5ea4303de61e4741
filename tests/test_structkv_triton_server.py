"""StructKV's pruned prefill on SGLang's triton attention backend, in real servers on the CPU.

Without a GPU, SGLang's triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), which
computes bf16 attention wrongly on a CPU, so both servers run a tiny random 6-layer Qwen2 model in
float32 (mechanics, not accuracy). The torch_native backend's StructKV is the reference (its pass is
tested in ``test_structkv_server.py``). Checked, with greedy decoding, one request at a time:

* the triton backend settles the same pivot at the same layer, computes the same rows per layer, keeps
  the same number of tokens per group and answers token for token as torch_native does;
* a prompt whose prefix is cached computes (and prunes) only the rest, as on torch_native;
* several requests in one extend batch are pruned each by its own decision, every group's slots are
  freed afterwards, and nothing raised;
* GemFilter-style mode restarts from layer 0 on the skeleton (a tiny Llama model).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
from test_structkv_server import LAYERS, SCORE_WINDOW, assert_clean, generate, prompt
from tiny_model import build_tiny_model

from sglang_pask.server_process import ServerProcess

pytestmark = pytest.mark.server

STRUCTKV = [
    "--kv-layer-groups",
    str(LAYERS),
    "--dtype",
    "float32",
    "--structkv",
    "--structkv-min-prompt",
    "0",
    "--structkv-prefill-ratio",
    "0.25",
    "--structkv-kv-ratio",
    "0.125",
    "--kv-policy",
    "snapkv",
    "--kv-budget",
    "0.5",
]
BACKENDS = {"triton": (["--attention-backend", "triton"], {"TRITON_INTERPRET": "1"}), "torch_native": ([], {})}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """StructKV on the triton and on the torch_native backend, the same tiny Qwen2 model."""
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), num_layers=LAYERS, arch="qwen2")
    logs = tmp_path_factory.mktemp("structkv-triton-logs")
    started: dict[str, ServerProcess] = {}
    try:
        for name, (flags, env) in BACKENDS.items():
            started[name] = ServerProcess(
                ["--model-path", str(model_dir), *STRUCTKV, *flags], logs / f"{name}.log", env=env
            ).wait_ready(timeout_s=300)
        yield started
    finally:
        for server in started.values():
            server.stop()


def summary(result: dict) -> tuple:
    """What must agree between the backends: the answer, the pruning and the KV kept."""
    stats = result["meta_info"]["kv_stats"]
    report = stats["structkv"]
    return (
        result.get("output_ids", result["text"]),
        report["pivot"],
        report["decided_at"],
        report["rows_per_layer"],
        report["skeleton_tokens"],
        stats["kept_tokens"],
    )


def test_triton_prunes_keeps_and_answers_as_torch_native(servers):
    texts = [prompt(i, 120 + 50 * i) for i in range(3)]
    ours = {name: [generate(server, text, 8) for text in texts] for name, server in servers.items()}
    assert [summary(r) for r in ours["triton"]] == [summary(r) for r in ours["torch_native"]]
    for result in ours["triton"]:
        report = result["meta_info"]["kv_stats"]["structkv"]
        n = report["computed_tokens"]
        skeleton = min(n, math.floor(0.25 * n) + SCORE_WINDOW)
        assert report["skeleton_tokens"] == skeleton < n
        decided = report["decided_at"]
        assert report["rows_per_layer"] == [n] * (decided + 1) + [skeleton] * (LAYERS - decided - 1)


def test_triton_prunes_only_the_uncached_part_of_a_prompt(servers):
    base = prompt(5, 160)
    results = {}
    for name, server in servers.items():
        generate(server, base, 2)
        results[name] = generate(server, base + " " + prompt(6, 120), 8)
    assert summary(results["triton"]) == summary(results["torch_native"])
    meta = results["triton"]["meta_info"]
    assert meta["cached_tokens"] > 0
    assert meta["kv_stats"]["structkv"]["computed_tokens"] == meta["prompt_tokens"] - meta["cached_tokens"]


def test_triton_prunes_a_batch_per_request_and_frees_every_slot(servers):
    server = servers["triton"]
    texts = [prompt(10 + i, 100 + 60 * i) for i in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda text: generate(server, text, 6), texts))
    for result in results:
        report = result["meta_info"]["kv_stats"]["structkv"]
        assert report["skeleton_tokens"] < report["computed_tokens"]
        assert report["rows_per_layer"][-1] == report["skeleton_tokens"]
        assert result["meta_info"]["completion_tokens"] == 6
    for name in servers:
        assert_clean(servers[name])


def test_gemfilter_mode_restarts_on_the_skeleton_on_triton(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny-llama", num_layers=LAYERS, arch="llama")
    flags, env = BACKENDS["triton"]
    server = ServerProcess(
        [
            "--model-path",
            str(model_dir),
            "--kv-layer-groups",
            str(LAYERS),
            "--dtype",
            "float32",
            "--structkv",
            "--structkv-min-prompt",
            "0",
            "--structkv-mode",
            "gemfilter",
            "--structkv-pivot",
            "2",
            *flags,
        ],
        tmp_path / "gemfilter.log",
        env=env,
    ).wait_ready(timeout_s=300)
    try:
        result = generate(server, prompt(3, 200), 6)
        report = result["meta_info"]["kv_stats"]["structkv"]
        n = report["computed_tokens"]
        assert report["mode"] == "gemfilter" and report["restarted"] and report["pivot"] == 2
        assert report["skeleton_tokens"] < n and report["rows_per_layer"] == [report["skeleton_tokens"]] * LAYERS
        assert result["meta_info"]["completion_tokens"] == 6
        assert_clean(server)
    finally:
        server.stop()
