"""StructKV inside real SGLang servers (tiny random 6-layer models: mechanics, not accuracy).

One server at a time (each test starts and stops its own):

* at R_struct = R_KV = 1 greedy outputs are token for token those of StructKV off (Qwen2);
* at R_struct = 0.25, R_KV = 0.125 the layers after the settled pivot compute only the skeleton
  rows, every layer group keeps R_KV of the prompt plus the window, decode runs under the KV
  policy, several requests batch together, a cached prefix is reused, and no slot leaks (Qwen2);
* GemFilter-style mode restarts from layer 0 on the skeleton (Llama; the paper's token selection
  and window of 8);
* with ``--structkv-kv-score centrality`` every group that computed the whole prompt keeps the same
  prompt tokens (one ranking, the skeleton's centrality);
* ``--structkv-min-prompt``: a shorter prompt is served as without StructKV, alone or batched
  with a pruned one.

The other tests run the defaults: segments (sentences, lines) and an observation window of 32.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from tiny_model import build_tiny_model

from sglang_pask.server_process import ServerProcess
from sglang_pask.structkv.segments import DEFAULT_MAX_SEGMENT

pytestmark = pytest.mark.server

LAYERS = 6
WINDOW = 8  # --kv-window: every group's KV keeps it
SCORE_WINDOW = 32  # --structkv-window (default): the skeleton keeps it
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def prompt(index: int, words: int) -> str:
    return " ".join(WORDS[(index * 7 + i * 3) % len(WORDS)] for i in range(words))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), num_layers=LAYERS, arch="qwen2")


def start(model_dir: Path, log: Path, *flags: str) -> ServerProcess:
    """A server of ``model_dir``; under ``--structkv`` every prompt is pruned (``--structkv-min-prompt
    0``: these prompts are far below the default 4096) unless ``flags`` set the minimum."""
    if "--structkv" in flags and "--structkv-min-prompt" not in flags:
        flags = (*flags, "--structkv-min-prompt", "0")
    return ServerProcess(["--model-path", str(model_dir), "--kv-layer-groups", str(LAYERS), *flags], log).wait_ready(
        timeout_s=300
    )


def generate(server: ServerProcess, text: str, max_new_tokens: int = 16) -> dict:
    response = requests.post(
        f"{server.url}/generate",
        timeout=300,
        json={
            "text": text,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        },
    )
    response.raise_for_status()
    return response.json()


def idle_pool(server: ServerProcess) -> dict:
    assert requests.post(f"{server.url}/flush_cache", timeout=30).status_code == 200
    info = requests.get(f"{server.url}/server_info", timeout=30).json()
    return info["internal_states"][0]["sglang_pask"]["kv_pool"]


def assert_clean(server: ServerProcess) -> None:
    pool = idle_pool(server)
    assert pool["tokens_in_use"] == 0 and all(g["slots_in_use"] == 0 for g in pool["groups"])
    log = server.log_path.read_text()
    assert "Traceback" not in log and "leak" not in log.lower(), server.log_tail(60)


def test_ratio_one_is_token_for_token_structkv_off(qwen2_dir, tmp_path):
    prompts = [prompt(i, 40 + 60 * i) for i in range(4)]
    outputs = {}
    for name, flags in (
        ("off", ()),
        ("on", ("--structkv", "--structkv-prefill-ratio", "1", "--structkv-kv-ratio", "1")),
    ):
        server = start(qwen2_dir, tmp_path / f"{name}.log", *flags)
        try:
            results = [generate(server, text, 24) for text in prompts]  # one at a time: same numerics
            outputs[name] = [r["output_ids"] if "output_ids" in r else r["text"] for r in results]
            if name == "on":
                for r in results:
                    report = r["meta_info"]["kv_stats"]["structkv"]
                    assert report["skeleton_tokens"] == report["computed_tokens"]
                    assert report["pivot"] is not None and 1 <= report["pivot"] <= LAYERS - 2
            assert_clean(server)
        finally:
            server.stop()
    assert outputs["on"] == outputs["off"]


def test_later_layers_compute_the_skeleton_and_decode_runs_without_leaks(qwen2_dir, tmp_path):
    server = start(
        qwen2_dir,
        tmp_path / "prune.log",
        "--structkv",
        "--structkv-prefill-ratio",
        "0.25",
        "--structkv-kv-ratio",
        "0.125",
        "--kv-policy",
        "snapkv",
        "--kv-budget",
        "0.5",
    )
    try:
        texts = [prompt(i, 150 + 40 * i) for i in range(4)]
        with ThreadPoolExecutor(max_workers=4) as pool:  # several requests per extend batch
            results = list(pool.map(lambda text: generate(server, text, 30), texts))
        for result in results:
            stats = result["meta_info"]["kv_stats"]
            report = stats["structkv"]
            n = report["computed_tokens"]
            skeleton = min(n, math.floor(0.25 * n) + SCORE_WINDOW)
            assert report["mode"] == "auto" and report["skeleton_tokens"] == skeleton < n
            # The prompt has no newline or sentence end: its segments are pieces of 48 tokens,
            # counted from the batch's own token ids.
            assert report["select"] == "segments" and report["segments"] == math.ceil(n / DEFAULT_MAX_SEGMENT)
            decided = report["decided_at"]
            assert 1 <= report["pivot"] <= decided <= LAYERS - 2
            assert report["rows_per_layer"] == [n] * (decided + 1) + [skeleton] * (LAYERS - decided - 1)
            assert result["meta_info"]["completion_tokens"] == 30
            # Each group keeps floor(R_KV n) + window prompt tokens, plus decode tokens under snapkv.
            prompt_kept = math.floor(0.125 * n) + WINDOW
            assert all(prompt_kept <= kept <= prompt_kept + 30 for kept in stats["kept_tokens"])
            assert any(kept < prompt_kept + 29 for kept in stats["kept_tokens"])  # snapkv compressed decode
        # A cached prefix is reused; only the rest is computed (and pruned).
        again = generate(server, texts[3] + " " + prompt(9, 120), 8)
        assert again["meta_info"]["cached_tokens"] > 0
        report = again["meta_info"]["kv_stats"]["structkv"]
        assert report["computed_tokens"] == again["meta_info"]["prompt_tokens"] - again["meta_info"]["cached_tokens"]
        assert_clean(server)
    finally:
        server.stop()


def test_gemfilter_mode_restarts_on_the_skeleton(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny-llama", num_layers=LAYERS, arch="llama")
    server = start(
        model_dir,
        tmp_path / "gemfilter.log",
        "--structkv",
        "--structkv-mode",
        "gemfilter",
        "--structkv-pivot",
        "2",
        "--structkv-select",
        "tokens",
        "--structkv-window",
        "8",
    )
    try:
        result = generate(server, prompt(3, 200), 12)
        report = result["meta_info"]["kv_stats"]["structkv"]
        n = report["computed_tokens"]
        skeleton = min(n, math.floor(0.2 * n) + 8)
        assert report["mode"] == "gemfilter" and report["restarted"] and report["pivot"] == 2
        assert report["select"] == "tokens" and report["segments"] is None
        assert report["rows_per_layer"] == [skeleton] * LAYERS
        assert result["meta_info"]["completion_tokens"] == 12
        assert_clean(server)
    finally:
        server.stop()


def test_centrality_ranked_kv_is_one_choice_in_every_group_that_saw_the_whole_prompt(qwen2_dir, tmp_path):
    server = start(
        qwen2_dir,
        tmp_path / "central.log",
        "--structkv",
        "--structkv-prefill-ratio",
        "0.25",
        "--structkv-kv-ratio",
        "0.125",
        "--structkv-kv-score",
        "centrality",
    )
    try:
        response = requests.post(
            f"{server.url}/generate",
            timeout=300,
            json={
                "text": prompt(5, 260),
                "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True, "return_kv_kept": True},
            },
        )
        response.raise_for_status()
        stats = response.json()["meta_info"]["kv_stats"]
        report = stats["structkv"]
        n, decided = report["computed_tokens"], report["decided_at"]
        prompt_kept = [sorted(p for p in group if p < n) for group in stats["kept_positions"]]
        assert all(len(kept) == math.floor(0.125 * n) + WINDOW for kept in prompt_kept)
        # Groups up to the decision computed all n tokens: one ranking, one choice.
        assert all(prompt_kept[g] == prompt_kept[0] for g in range(decided + 1))
        assert_clean(server)
    finally:
        server.stop()


def test_prompts_shorter_than_min_prompt_are_served_unpruned(qwen2_dir, tmp_path):
    """Alone, a short prompt's answer is a StructKV-off server's (same policy); batched with a long one,
    only the long one is pruned, and the short one keeps its --kv-policy budget of the prompt."""
    policy = ("--kv-policy", "snapkv", "--kv-budget", "0.5", "--kv-decode", "keep")
    short, long = prompt(1, 60), prompt(2, 300)
    server = start(qwen2_dir, tmp_path / "off.log", *policy)
    try:
        expected = generate(server, short, 12)["output_ids"]
    finally:
        server.stop()
    server = start(
        qwen2_dir,
        tmp_path / "min.log",
        *policy,
        "--structkv",
        "--structkv-min-prompt",
        "200",
        "--structkv-prefill-ratio",
        "0.25",
        "--structkv-kv-ratio",
        "0.125",
    )
    try:
        alone = generate(server, short, 12)
        assert alone["output_ids"] == expected
        assert alone["meta_info"]["prompt_tokens"] < 200 and "structkv" not in alone["meta_info"]["kv_stats"]
        with ThreadPoolExecutor(max_workers=2) as pool:  # one extend batch with both, as the log shows
            short_result, long_result = pool.map(lambda text: generate(server, text, 4), (short, long))
        assert long_result["meta_info"]["prompt_tokens"] >= 200
        report = long_result["meta_info"]["kv_stats"]["structkv"]
        assert report["skeleton_tokens"] < report["computed_tokens"]
        stats = short_result["meta_info"]["kv_stats"]
        n = short_result["meta_info"]["prompt_tokens"]
        assert "structkv" not in stats
        # snapkv at 0.5 of the prompt (plus the answer, kept), not StructKV's R_KV of 0.125.
        assert all(kept >= math.floor(0.5 * n) for kept in stats["kept_tokens"])
        assert_clean(server)
    finally:
        server.stop()


def test_a_request_asking_for_prompt_logprobs_is_unpruned_and_its_batch_pruned_as_alone(qwen2_dir, tmp_path):
    """Issue 51, problem 3: one request's logprobs switched StructKV off for its whole batch, so another
    client's answer changed. The decision is per request: prompt logprobs need every row (that request
    runs unpruned), output logprobs only the last one (that request is pruned as any other)."""
    server = start(
        qwen2_dir,
        tmp_path / "logprobs.log",
        "--kv-policy",
        "snapkv",
        "--kv-budget",
        "0.5",
        "--kv-decode",
        "keep",
        "--disable-radix-cache",
        "--structkv",
        "--structkv-prefill-ratio",
        "0.25",
        "--structkv-kv-ratio",
        "0.125",
    )
    sampling = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, "return_kv_kept": True}

    def post(body: dict) -> object:
        response = requests.post(f"{server.url}/generate", json={"sampling_params": sampling, **body}, timeout=300)
        response.raise_for_status()
        return response.json()

    long, short = prompt(3, 300), prompt(4, 40)
    try:
        alone = post({"text": long})
        assert "structkv" in alone["meta_info"]["kv_stats"]
        batch = post({"text": [long, short], "return_logprob": [False, True], "logprob_start_len": [-1, 0]})
        assert batch[0]["output_ids"] == alone["output_ids"]
        assert batch[0]["meta_info"]["kv_stats"] == alone["meta_info"]["kv_stats"]
        asked = batch[1]["meta_info"]
        assert "structkv" not in asked["kv_stats"]
        assert len(asked["input_token_logprobs"]) == asked["prompt_tokens"]
        output_only = post({"text": long, "return_logprob": True})
        assert output_only["output_ids"] == alone["output_ids"]
        assert output_only["meta_info"]["kv_stats"]["structkv"] == alone["meta_info"]["kv_stats"]["structkv"]
        assert len(output_only["meta_info"]["output_token_logprobs"]) == 8
        assert_clean(server)
    finally:
        server.stop()
