"""The layer-group KV pool inside real SGLang servers (tiny random model: mechanics, not accuracy).

* 200 mixed requests (lengths, shared prefixes, grammars, aborts) leave every allocator where it
  started, and the scheduler's own idle leak check (which sglang-pask extends to every group) never
  fires;
* a shared system prompt gets the same prefix-cache hits with compression on as off;
* every policy serves requests through real SGLang and reports ``kv_stats``.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import requests

from sglang_pask.server_process import ServerProcess

pytestmark = pytest.mark.server

COMPRESSED_FLAGS = ["--kv-budget", "0.33", "--kv-layer-groups", "0-0,1-1", "--kv-window", "4"]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
SYSTEM = "You are a careful assistant. Tools: get_weather(city, unit), get_time(zone). " * 3


def start(model_dir: Path, log: Path, policy: str, *extra: str) -> ServerProcess:
    return ServerProcess(
        [
            "--model-path",
            str(model_dir),
            "--constrained-json-disable-any-whitespace",
            "--kv-policy",
            policy,
            *COMPRESSED_FLAGS,
            *extra,
        ],
        log,
    ).wait_ready(timeout_s=300)


@pytest.fixture(scope="module")
def snapkv_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start(tiny_model_dir, tmp_path_factory.mktemp("logs") / "snapkv_server.log", "snapkv", "--enable-metrics")
    try:
        yield server
    finally:
        server.stop()


def generate(server: ServerProcess, text: str, timeout: float = 120, **params) -> dict:
    response = requests.post(
        f"{server.url}/generate",
        json={"text": text, "sampling_params": {"temperature": 0, **params}},
        timeout=timeout,
    )
    response.raise_for_status()
    return response.json()


def pool_usage(server: ServerProcess) -> dict:
    info = requests.get(f"{server.url}/server_info", timeout=30).json()
    return info["internal_states"][0]["sglang_pask"]["kv_pool"]


def wait_idle_and_flush(server: ServerProcess) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if requests.post(f"{server.url}/flush_cache", timeout=30).status_code == 200:
            return
        time.sleep(0.5)
    raise AssertionError("the server never became idle enough to flush its prefix cache")


def mixed_request(server: ServerProcess, index: int) -> dict | None:
    rng = random.Random(index)
    kind = index % 5
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 120)))
    if kind == 0:  # shared system prompt
        return generate(server, SYSTEM + prompt, max_new_tokens=rng.randint(1, 24))
    if kind == 1:  # regex-constrained
        return generate(server, prompt, max_new_tokens=16, regex="(yes|no)[0-9]{2}")
    if kind == 2:  # JSON-constrained
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        return generate(server, prompt, max_new_tokens=24, json_schema=__import__("json").dumps(schema))
    if kind == 3:  # aborted mid-decode
        rid = uuid.uuid4().hex
        timer = threading.Timer(
            0.3, lambda: requests.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=30)
        )
        timer.start()
        try:
            response = requests.post(
                f"{server.url}/generate",
                json={
                    "text": prompt,
                    "rid": rid,
                    "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True},
                },
                timeout=120,
            )
        finally:
            timer.join()
        return None if response.status_code != 200 else response.json()
    return generate(server, prompt, max_new_tokens=rng.randint(1, 64))


def test_two_hundred_mixed_requests_leave_every_allocator_where_it_started(snapkv_server):
    wait_idle_and_flush(snapkv_server)
    before = pool_usage(snapkv_server)
    assert before["tokens_in_use"] == 0 and all(g["slots_in_use"] == 0 for g in before["groups"])
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda i: mixed_request(snapkv_server, i), range(200)))
    finished = [r for r in results if r is not None and r["meta_info"]["finish_reason"]["type"] != "abort"]
    assert len(finished) >= 150
    compressed = 0
    for result in finished:
        stats = result["meta_info"]["kv_stats"]
        assert stats["policy"] == "snapkv" and len(stats["kept_tokens"]) == 2
        assert all(0 < kept <= stats["full_tokens"] for kept in stats["kept_tokens"])
        compressed += any(kept < stats["full_tokens"] for kept in stats["kept_tokens"])
    assert compressed >= len(finished) // 2
    # While the prefix cache holds finished requests, its tokens hold fewer group slots than ids.
    during = pool_usage(snapkv_server)
    assert during["bytes_in_use"] < during["full_equivalent_bytes"]
    wait_idle_and_flush(snapkv_server)
    after = pool_usage(snapkv_server)
    assert after["tokens_in_use"] == 0
    assert [g["slots_in_use"] for g in after["groups"]] == [0, 0]
    log = snapkv_server.log_path.read_text()
    assert "leak" not in log.lower(), snapkv_server.log_tail(60)
    assert "Traceback" not in log, snapkv_server.log_tail(60)


def test_shared_system_prompt_gets_the_same_prefix_hits_with_compression(snapkv_server, tiny_server):
    questions = [f"Question {i}: what is {WORDS[i]} of {WORDS[-i - 1]}?" for i in range(8)]
    hits = {}
    for name, server in (("full", tiny_server), ("snapkv", snapkv_server)):
        wait_idle_and_flush(server)
        hits[name] = [
            generate(server, SYSTEM + question, max_new_tokens=8)["meta_info"]["cached_tokens"]
            for question in questions
        ]
    assert hits["snapkv"] == hits["full"]
    assert sum(hits["full"][1:]) > 0


@pytest.mark.parametrize("policy", ["streaming-llm", "h2o", "pyramidkv"])
def test_every_policy_serves_through_sglang(policy, tiny_model_dir, tmp_path):
    # Chunked prefill on (it bounds what one pass writes to every group): pyramidkv's groups are sized
    # by their budgets.
    server = start(tiny_model_dir, tmp_path / f"{policy}.log", policy, "--chunked-prefill-size", "256")
    try:
        for i in range(6):
            result = generate(server, SYSTEM + " ".join(WORDS[: 5 + 2 * i]), max_new_tokens=20)
            stats = result["meta_info"]["kv_stats"]
            assert stats["policy"] == policy and stats["full_tokens"] > 0
            assert all(kept < stats["full_tokens"] for kept in stats["kept_tokens"])
        wait_idle_and_flush(server)
        after = pool_usage(server)
        assert after["tokens_in_use"] == 0 and [g["slots_in_use"] for g in after["groups"]] == [0, 0]
        assert_pool_sized_by_budget(after)
        assert "Traceback" not in server.log_path.read_text()
    finally:
        server.stop()


def assert_pool_sized_by_budget(usage: dict) -> None:
    """Each group's slots follow its budget (equal budgets: SGLang's P each), its bytes are its real
    buffers ((slots + 1 padding row) x bytes per slot), and all groups together take at most the bytes
    of SGLang's own pool (P + 1 rows in every layer)."""
    groups, stock = usage["groups"], usage["physical_slots"]
    for group in groups:
        assert group["bytes"] == (group["slots"] + 1) * group["bytes_per_slot"]
    budgets = [g["budget"] for g in groups]
    slots = [g["slots"] for g in groups]
    if len(set(budgets)) == 1:
        assert slots == [stock] * len(groups)
    else:
        assert slots == sorted(slots, reverse=True) and slots[0] > stock > slots[-1]
    stock_bytes = sum((stock + 1) * g["bytes_per_slot"] for g in groups)
    assert stock_bytes - sum(g["bytes_per_slot"] for g in groups) <= usage["bytes"] <= stock_bytes


def test_pool_usage_is_in_the_prometheus_metrics(snapkv_server):
    generate(snapkv_server, SYSTEM + "metrics please", max_new_tokens=30)
    text = requests.get(f"{snapkv_server.url}/metrics", timeout=30).text
    for name in (
        "sglang_pask:kv_pool_bytes_in_use",
        "sglang_pask:kv_pool_slots_in_use",
        "sglang_pask:kv_pool_full_equivalent_bytes",
        "sglang_pask:kv_pool_running_requests",
    ):
        assert name in text, name
    assert 'group="0-0"' in text and 'group="1-1"' in text


def test_sglang_token_usage_is_the_pools_own_and_about_0_on_an_idle_server(snapkv_server):
    # SGLang counted free virtual ids against the per-group slots: an idle compressed server logged
    # "token usage: 0.87" and exported it as sglang:token_usage (issue 51, problem 4).
    assert requests.post(f"{snapkv_server.url}/flush_cache", timeout=60).status_code == 200
    idle = pool_usage(snapkv_server)
    assert idle["token_usage"] == 0.0 and idle["tokens_in_use"] == 0
    mark = snapkv_server.log_path.stat().st_size
    generate(snapkv_server, SYSTEM + "usage please", max_new_tokens=8)
    after = pool_usage(snapkv_server)
    fullest = max(group["slots_in_use"] / group["slots"] for group in after["groups"])
    assert after["token_usage"] == pytest.approx(fullest) and 0 < fullest < 0.05
    snapkv_server.log_tail()  # flushes the log
    with open(snapkv_server.log_path, errors="replace") as log:
        log.seek(mark)
        logged = [float(u) for u in re.findall(r"Prefill batch.*?token usage: ([0-9.]+)", log.read())]
    assert logged and max(logged) < 0.05, logged
    metrics = requests.get(f"{snapkv_server.url}/metrics", timeout=30).text
    gauge = re.search(r"^sglang:token_usage\{[^}]*\} ([0-9.e-]+)$", metrics, re.M)
    assert gauge is not None and float(gauge.group(1)) < 0.05, metrics[:2000]


def test_kv_decode_keep_holds_every_generated_token_and_frees_every_slot(tiny_model_dir, tmp_path):
    from sglang_pask.policy import capacity

    server = start(tiny_model_dir, tmp_path / "keep.log", "snapkv", "--kv-decode", "keep", "--disable-radix-cache")
    try:
        for i in range(3):
            result = generate(server, SYSTEM + " ".join(WORDS[: 5 + 4 * i]), max_new_tokens=40, ignore_eos=True)
            meta = result["meta_info"]
            prompt, generated = meta["prompt_tokens"], meta["completion_tokens"]
            assert generated == 40
            stats = meta["kv_stats"]
            answer_in_cache = stats["full_tokens"] - prompt  # the last sampled token is never written
            assert answer_in_cache == generated - 1
            # The prompt compressed after prefill as ever; none of the answer dropped.
            assert stats["kept_tokens"] == [capacity(0.33, prompt, 4) + answer_in_cache] * 2, (prompt, stats)
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        assert info["internal_states"][0]["sglang_pask"]["kv_decode"] == "keep"
        wait_idle_and_flush(server)
        after = pool_usage(server)
        assert after["tokens_in_use"] == 0 and [g["slots_in_use"] for g in after["groups"]] == [0, 0]
        assert "Traceback" not in server.log_path.read_text()
    finally:
        server.stop()


@pytest.mark.parametrize("mode, decode", [("2bit", "keep"), ("k4v2", "lowbit")])
def test_kv_dropped_low_bit_keeps_every_prompt_token_readable_and_frees_every_slot(
    tiny_model_dir, tmp_path, mode, decode
):
    server = start(tiny_model_dir, tmp_path / f"{mode}.log", "snapkv", "--kv-decode", decode, "--kv-dropped", mode)
    try:
        # 45 generated tokens: under --kv-decode lowbit the 32 oldest leave the window (8) and fill a block.
        meta = generate(server, "answer " + " ".join(WORDS), max_new_tokens=45, ignore_eos=True, return_kv_kept=True)[
            "meta_info"
        ]
        prompt_len = meta["prompt_tokens"]
        for lowbit in meta["kv_stats"]["lowbit_positions"]:
            generated = [p for p in lowbit if p >= prompt_len]
            assert generated == (list(range(prompt_len, prompt_len + 32)) if decode == "lowbit" else [])
        # A prompt no other request shares, then one that extends it and matches it in the radix
        # cache: every position of each is read, in full or at low precision (the second reads the
        # first's low-bit tokens from the cache; before token-owned blocks it lost them).
        prompt = "unique " + " ".join(WORDS * 4)
        for text, cached in ((prompt, False), (prompt + " and then " + " ".join(WORDS[:20]), True)):
            meta = generate(server, text, max_new_tokens=8, ignore_eos=True, return_kv_kept=True)["meta_info"]
            assert (meta["cached_tokens"] > 40) == cached, meta["cached_tokens"]
            stats = meta["kv_stats"]
            assert stats["kv_dropped"] == mode
            for kept, lowbit, count in zip(stats["kept_positions"], stats["lowbit_positions"], stats["lowbit_tokens"]):
                assert count == len(lowbit) > 0 and not set(kept) & set(lowbit)
                assert sorted(set(kept) | set(lowbit)) == list(range(stats["full_tokens"]))
                if cached:
                    assert min(lowbit) < meta["cached_tokens"]  # low-bit tokens of the cached prefix
            for lowbit, slots, places in zip(
                stats["lowbit_positions"], stats["lowbit_slots"], stats["lowbit_block_places"]
            ):
                assert places["row_tokens"] == len(lowbit) and places["blocks"] * 32 == sum(
                    places[k] for k in ("row_tokens", "other_rows", "freed", "never_filled")
                )
                assert slots % places["blocks"] == 0 and places["passes"] >= 1
        # Concurrent requests sharing a cached system prompt, some constrained.
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(
                pool.map(
                    lambda i: generate(
                        server,
                        SYSTEM + " ".join(WORDS[i : i + 30]),
                        max_new_tokens=12,
                        **({"regex": "(yes|no)[0-9]{2}"} if i % 2 else {}),
                    ),
                    range(8),
                )
            )
        assert all(r["meta_info"]["kv_stats"]["kv_dropped"] == mode for r in results)
        wait_idle_and_flush(server)
        after = pool_usage(server)
        assert after["kv_dropped"] == mode and after["tokens_in_use"] == 0 and after["lowbit_unstored_tokens"] == 0
        assert [(g["slots_in_use"], g["lowbit_slots_in_use"]) for g in after["groups"]] == [(0, 0), (0, 0)]
        log = server.log_path.read_text()
        assert "leak" not in log.lower() and "Traceback" not in log, server.log_tail(60)
    finally:
        server.stop()


def test_policy_args_reach_the_scheduler(tiny_model_dir, tmp_path):
    """--kv-policy-args num_sinks=12: every group keeps the first 12 positions and the capacity grows by them."""
    from sglang_pask.policy import capacity

    server = start(
        tiny_model_dir,
        tmp_path / "sinks.log",
        "streaming-llm",
        "--kv-policy-args",
        "num_sinks=12",
        "--kv-decode",
        "keep",
        "--disable-radix-cache",
    )
    try:
        result = generate(server, SYSTEM + " ".join(WORDS), max_new_tokens=4, ignore_eos=True, return_kv_kept=True)
        stats, prompt = result["meta_info"]["kv_stats"], result["meta_info"]["prompt_tokens"]
        for kept in stats["kept_positions"]:
            prompt_kept = [p for p in kept if p < prompt]
            assert prompt_kept[:12] == list(range(12))
            assert len(prompt_kept) == capacity(0.33, prompt, 4, 12)
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        assert info["internal_states"][0]["sglang_pask"]["kv_policy_args"] == "num_sinks=12"
        # The start-up self-check ran in the launcher, the scheduler and the detokenizer.
        applied = re.findall(r"^sglang-pask: 22 hooks applied \((\S+), pid \d+\)$", server.log_path.read_text(), re.M)
        assert len(applied) >= 3, applied
        wait_idle_and_flush(server)
        assert pool_usage(server)["tokens_in_use"] == 0
    finally:
        server.stop()
