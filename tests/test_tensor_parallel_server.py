"""Tensor parallelism (``--tp-size 2``) on SGLang's CPU engine, tiny random model (issue 51, item 2).

Each rank holds one of the model's two KV heads and runs its own scheduler over its own layer-group
pool. The launcher gives each rank its share of the cores (``SGLANG_CPU_OMP_THREADS_BIND``); the
policies' scores are summed over the ranks, so every rank keeps the same tokens: ``/server_info``'s
``tp_ranks`` reports each rank's pool and a hash of what each group holds.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from test_pask_server import SCHEMA, write_policy

from sglang_pask.server_process import ServerProcess

pytestmark = pytest.mark.server

SYSTEM = "You are a careful assistant. Tools: get_weather(city, unit), get_time(zone). " * 2
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
# The shared tiny servers' SGLang flag (tests/conftest.py): a random model favours whitespace.
SGLANG_FLAGS = ["--constrained-json-disable-any-whitespace"]
REGEX = r"(yes|no)[0-9]{2}"


def start_tp2(model_dir: Path, log: Path, *flags: str) -> ServerProcess:
    args = ["--model-path", str(model_dir), *SGLANG_FLAGS, "--tp-size", "2", *flags]
    return ServerProcess(args, log).wait_ready(timeout_s=420)


def generate(server: ServerProcess, text: str, **params) -> dict:
    response = requests.post(
        f"{server.url}/generate", json={"text": text, "sampling_params": {"temperature": 0, **params}}, timeout=300
    )
    response.raise_for_status()
    return response.json()


def rank_reports(server: ServerProcess) -> list[dict]:
    info = requests.get(f"{server.url}/server_info", timeout=120).json()
    ranks = info["internal_states"][0]["sglang_pask"]["tp_ranks"]
    assert [r["tp_rank"] for r in ranks] == [0, 1]
    return ranks


def assert_ranks_agree(server: ServerProcess) -> list[dict]:
    """Both ranks hold the same tokens in every group, with the same slot counts."""
    first, second = rank_reports(server)
    assert first["held"] == second["held"]
    for mine, theirs in zip(first["kv_pool"]["groups"], second["kv_pool"]["groups"]):
        assert (mine["slots_in_use"], mine["lowbit_slots_in_use"]) == (
            theirs["slots_in_use"],
            theirs["lowbit_slots_in_use"],
        )
    assert first["kv_pool"]["tokens_in_use"] == second["kv_pool"]["tokens_in_use"]
    return [first, second]


def mixed_load(server: ServerProcess, count: int = 50) -> None:
    """``count`` requests in flight 8 at a time: plain, regex, JSON Schema, some aborted."""
    rng = random.Random(51)

    def one(index: int) -> str:
        text = SYSTEM + " ".join(rng.choice(WORDS) for _ in range(5 + index % 40))
        kind = index % 4
        if kind == 3:  # aborted while it decodes
            rid = uuid.uuid4().hex
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(
                    requests.post,
                    f"{server.url}/generate",
                    json={"text": text, "rid": rid, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}},
                    timeout=300,
                )
                requests.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=60)
                return str(pending.result().status_code)
        params = [{}, {"regex": REGEX}, {"json_schema": SCHEMA}][kind]
        out = generate(server, text, max_new_tokens=24, **params)
        if kind == 1:
            assert re.fullmatch(REGEX, out["text"]), out["text"]
        if kind == 2:
            assert set(json.loads(out["text"])) >= {"city", "days"}
        return "ok"

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(count)))
    assert results.count("ok") == count - count // 4


def test_at_budget_1_two_ranks_answer_as_one(tiny_server, tiny_server_flags, tiny_model_dir, tmp_path):
    prompts = ["def forward(self, x):", SYSTEM + "Weather in Rome?", "import numpy as np\n"]
    expected = [generate(tiny_server, p, max_new_tokens=12, ignore_eos=True)["output_ids"] for p in prompts]
    server = start_tp2(tiny_model_dir, tmp_path / "tp2_full.log", *tiny_server_flags)
    try:
        got = [generate(server, p, max_new_tokens=12, ignore_eos=True)["output_ids"] for p in prompts]
        assert got == expected
        assert_ranks_agree(server)
    finally:
        server.stop()


@pytest.mark.parametrize(
    "name, requests_in_load, flags",
    [
        (
            "k4v2-lowbit",
            20,
            ["--kv-policy", "snapkv", "--kv-budget", "0.1", "--kv-dropped", "k4v2", "--kv-decode", "lowbit"],
        ),
        ("pask", 50, ["--kv-policy", "pask", "--kv-budget", "0.5"]),
    ],
)
def test_every_rank_keeps_the_same_tokens_under_load_and_frees_every_slot(
    tiny_model_dir, tmp_path, name, requests_in_load, flags
):
    """Without the scores summed over the ranks, the two ranks of a snapkv server held other tokens
    (measured: 75 and 93 slots in group 0 after three requests); with it, the same ones."""
    if name == "pask":
        flags = [*flags, "--pask-policy", str(write_policy(tmp_path / "policy.json", tiny_model_dir))]
    server = start_tp2(tiny_model_dir, tmp_path / f"tp2_{name}.log", "--kv-layer-groups", "0-0,1-1", *flags)
    try:
        out = generate(server, SYSTEM + "Is it warm in Paris?", max_new_tokens=40, ignore_eos=True, return_kv_kept=True)
        stats = out["meta_info"]["kv_stats"]
        assert min(stats["kept_tokens"]) < stats["full_tokens"]  # it compresses
        assert_ranks_agree(server)
        mixed_load(server, requests_in_load)
        ranks = assert_ranks_agree(server)
        assert all(r["kv_pool"]["tokens_in_use"] > 0 for r in ranks)  # the radix cache holds the prompts
        assert requests.post(f"{server.url}/flush_cache", timeout=60).status_code == 200
        for report in assert_ranks_agree(server):
            assert report["kv_pool"]["tokens_in_use"] == 0
            assert all(g["slots_in_use"] == 0 for g in report["kv_pool"]["groups"])
    finally:
        server.stop()


def test_data_parallel_replicas_each_have_their_own_pool(tiny_model_dir, tmp_path):
    """``--dp-size 2``: SGLang's DP controller sends requests to two schedulers, each with its pool."""
    args = ["--model-path", str(tiny_model_dir), *SGLANG_FLAGS, "--dp-size", "2"]
    flags = ["--kv-policy", "snapkv", "--kv-budget", "0.33", "--kv-layer-groups", "0-0,1-1"]
    server = ServerProcess([*args, *flags], tmp_path / "dp2.log").wait_ready(timeout_s=420)
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            outs = list(pool.map(lambda i: generate(server, SYSTEM + WORDS[i], max_new_tokens=16), range(8)))
        assert all(out["meta_info"]["completion_tokens"] == 16 for out in outs)
        states = requests.get(f"{server.url}/server_info", timeout=120).json()["internal_states"]
        pools = [state["sglang_pask"]["kv_pool"] for state in states]
        assert len({state["sglang_pask"]["pid"] for state in states}) == 2
        assert all(p["tokens_in_use"] > 0 for p in pools)  # both replicas served and cached
        assert requests.post(f"{server.url}/flush_cache", timeout=60).status_code == 200
        states = requests.get(f"{server.url}/server_info", timeout=120).json()["internal_states"]
        assert all(state["sglang_pask"]["kv_pool"]["tokens_in_use"] == 0 for state in states)
    finally:
        server.stop()
