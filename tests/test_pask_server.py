"""``--kv-policy pask`` in a real SGLang server on the tiny model, and the calibration probes."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import requests

from sglang_pask.policy import PaskTable
from sglang_pask.policy.pask import NUM_ROLES
from sglang_pask.policy.pask_file import Tiers, save_policy_file, table_to_json
from sglang_pask.server_process import ServerProcess
from sglang_pask.structure.roles import Role

RANGES = [range(0, 1), range(1, 2)]
PROMPT = (
    "<|im_start|>user\nWhat is the weather in Paris and in Rome today, in celsius?<|im_end|>\n<|im_start|>assistant\n"
)
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "days"],
    }
)


SINKS = 2


def write_policy(path: Path, model_dir: Path, num_layers: int = 2, sinks: int = 0) -> Path:
    floors = [0.0] * NUM_ROLES
    floors[Role.USER_QUESTION] = 1.0
    table = PaskTable(
        floors=(tuple(floors), tuple([0.0] * NUM_ROLES)),
        residual_shares=(0.5, 0.5),
        layers_per_group=(1, 1),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
        sinks=sinks,
    )
    data = table_to_json(table, model_dir.name, RANGES, {"note": "written by a test"})
    data["model"]["num_layers"] = num_layers
    save_policy_file(path, data)
    return path


@pytest.fixture(scope="module")
def pask_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("pask")
    policy = write_policy(folder / "policy.json", tiny_model_dir, sinks=SINKS)
    server = ServerProcess(
        [
            "--model-path",
            str(tiny_model_dir),
            "--constrained-json-disable-any-whitespace",
            "--kv-policy",
            "pask",
            "--pask-policy",
            str(policy),
            "--kv-budget",
            "0.5",
            "--kv-layer-groups",
            "0-0,1-1",
            "--kv-window",
            "4",
        ],
        folder / "server.log",
    )
    try:
        yield server.wait_ready(timeout_s=300)
    finally:
        server.stop()


def generate(server: ServerProcess, **params) -> requests.Response:
    return requests.post(
        f"{server.url}/generate", json={"text": PROMPT, "sampling_params": {"temperature": 0, **params}}, timeout=120
    )


@pytest.mark.server
def test_pask_serves_grammar_constrained_requests_within_budget(pask_server):
    for grammar in ({"json_schema": SCHEMA}, {"regex": "(yes|no)[0-9]{2}"}, {"ebnf": 'root ::= "SELECT " [a-z]+'}):
        response = generate(pask_server, max_new_tokens=40, return_kv_kept=True, **grammar)
        assert response.status_code == 200, response.text
        stats = response.json()["meta_info"]["kv_stats"]
        assert stats["policy"] == "pask" and len(stats["group_budgets"]) == 2
        for kept, budget, positions in zip(stats["kept_tokens"], stats["group_budgets"], stats["kept_positions"]):
            # b of the prompt and of the output, plus the window and the decode slack, plus the sinks.
            assert kept <= budget * stats["full_tokens"] + 4 + 4 + 2 + SINKS
            assert positions[:SINKS] == list(range(SINKS))  # the sinks, kept in every group


@pytest.mark.server
def test_calibration_probe_drops_one_role_in_one_group(pask_server):
    requests.post(f"{pask_server.url}/flush_cache", timeout=30)
    response = generate(
        pask_server,
        max_new_tokens=1,
        return_kv_roles=True,
        custom_params={"pask_probe": {"drop_group": 1, "drop_role": "user_question"}},
    )
    assert response.status_code == 200, response.text
    meta = response.json()["meta_info"]
    question = meta["kv_prompt_roles"].count("user_question")
    assert question > 5
    stats = meta["kv_stats"]
    assert stats["kept_tokens"] == [stats["full_tokens"], stats["full_tokens"] - question]
    requests.post(f"{pask_server.url}/flush_cache", timeout=30)
    everywhere = generate(
        pask_server, max_new_tokens=1, custom_params={"pask_probe": {"drop_group": "all", "drop_role": "user_question"}}
    )
    assert everywhere.status_code == 200, everywhere.text
    stats = everywhere.json()["meta_info"]["kv_stats"]
    assert stats["kept_tokens"] == [stats["full_tokens"] - question] * 2


@pytest.mark.server
def test_calibration_probe_measures_distortion(pask_server):
    response = generate(pask_server, max_new_tokens=1, custom_params={"pask_probe": {"distortion_budget": 0.3}})
    assert response.status_code == 200, response.text
    distortion = response.json()["meta_info"]["kv_stats"]["distortion"]
    assert len(distortion) == 2 and all(0.0 < d < 10.0 for d in distortion)


@pytest.mark.server
@pytest.mark.parametrize(
    "probe",
    [
        {"drop_group": 1},
        {"drop_group": -1, "drop_role": "boundary"},
        {"drop_group": 2, "drop_role": "boundary"},
        {"drop_group": "everywhere", "drop_role": "boundary"},
        {"drop_group": 0, "drop_role": "nonsense"},
        {"drop_group": 0, "drop_role": "all"},
        {"distortion_budget": 2},
        {"drop_group": 0, "drop_role": "boundary", "lowbit": "fp8"},
        {"lowbit": "k4v2", "distortion_budget": 0.3},
        "x",
    ],
)
def test_malformed_probes_are_refused(pask_server, probe):
    response = generate(pask_server, max_new_tokens=1, custom_params={"pask_probe": probe})
    assert response.status_code == 400 and "pask_probe" in response.text


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_pask.launch_server", *args], capture_output=True, text=True, timeout=120
    )


def test_pask_start_up_errors(tiny_model_dir, tmp_path):
    model = ["--model-path", str(tiny_model_dir), "--kv-layer-groups", "0-0,1-1"]
    missing = launch(*model, "--kv-policy", "pask")
    assert missing.returncode == 2 and "no calibrated PASK policy ships" in missing.stderr
    wrong_policy = launch(*model, "--kv-policy", "snapkv", "--pask-policy", "x.json")
    assert wrong_policy.returncode == 2 and "--pask-policy applies to --kv-policy pask only" in wrong_policy.stderr
    other_model = write_policy(tmp_path / "other.json", tiny_model_dir, num_layers=4)
    mismatch = launch(*model, "--kv-policy", "pask", "--pask-policy", str(other_model))
    assert mismatch.returncode == 2 and "4-layer model" in mismatch.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    malformed = launch(*model, "--kv-policy", "pask", "--pask-policy", str(broken))
    assert malformed.returncode == 2 and "not valid JSON" in malformed.stderr
    compress_policy = write_policy(tmp_path / "compress.json", tiny_model_dir)
    other_mode = launch(*model, "--kv-policy", "pask", "--pask-policy", str(compress_policy), "--kv-decode", "keep")
    assert other_mode.returncode == 2 and len(other_mode.stderr.strip().splitlines()) == 1
    assert "calibrated for --kv-decode compress, the server runs --kv-decode keep" in other_mode.stderr
    missing_keep = launch(*model, "--kv-policy", "pask", "--kv-decode", "keep")
    assert missing_keep.returncode == 2 and "no calibrated PASK policy ships" in missing_keep.stderr
    assert "--kv-decode keep" in missing_keep.stderr


def write_tiered_policy(path: Path, model_dir: Path) -> Path:
    """Group 0: the question in full, the chat template at low bits, every other role evicted; group 1:
    every role at low bits. Solved (by hand) for 0.3 of full KV's bytes, served at --kv-budget 0.1."""
    question, template = [0.0] * NUM_ROLES, [0.0] * NUM_ROLES
    question[Role.USER_QUESTION] = 1.0
    template[Role.TEMPLATE] = 1.0
    table = PaskTable(
        floors=(tuple(question), tuple([0.0] * NUM_ROLES)),
        residual_shares=(0.5, 0.5),
        layers_per_group=(1, 1),
        role_frequencies=tuple([1.0 / NUM_ROLES] * NUM_ROLES),
        lowbit=(tuple(template), tuple([1.0] * NUM_ROLES)),
    )
    tiers = Tiers(lowbit_format="k4v2", kv_bytes=0.3, kv_budget=0.1)
    save_policy_file(path, table_to_json(table, model_dir.name, RANGES, {"kv_decode": "keep"}, tiers))
    return path


@pytest.mark.server
def test_three_tiers_serve_through_sglang_and_every_slot_comes_back(tiny_model_dir, tmp_path):
    policy = write_tiered_policy(tmp_path / "tiers.json", tiny_model_dir)
    server = ServerProcess(
        [
            "--model-path",
            str(tiny_model_dir),
            "--constrained-json-disable-any-whitespace",
            "--kv-policy",
            "pask",
            "--pask-policy",
            str(policy),
            "--kv-bytes",
            "0.3",
            "--kv-dropped",
            "k4v2",
            "--kv-decode",
            "lowbit",
            "--kv-layer-groups",
            "0-0,1-1",
            "--kv-window",
            "4",
        ],
        tmp_path / "server.log",
    ).wait_ready(timeout_s=300)
    try:
        text = PROMPT + "Answer with the city, then the days, as JSON. " * 3
        response = requests.post(
            f"{server.url}/generate",
            json={
                "text": text,
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": 40,
                    "ignore_eos": True,
                    "return_kv_roles": True,
                    "return_kv_kept": True,
                },
            },
            timeout=120,
        )
        assert response.status_code == 200, response.text
        meta = response.json()["meta_info"]
        stats, roles = meta["kv_stats"], meta["kv_prompt_roles"]
        prompt_len = len(roles)
        assert stats["budget"] == pytest.approx(0.1) and stats["kv_dropped"] == "k4v2"
        window = set(range(stats["full_tokens"] - 4, stats["full_tokens"]))
        (kept0, kept1), (low0, low1) = (
            [set(p) for p in stats["kept_positions"]],
            [set(p) for p in stats["lowbit_positions"]],
        )
        assert not kept0 & low0 and not kept1 & low1
        prompt = set(range(prompt_len))
        # Group 1: every prompt token readable (in full or at low bits).
        assert prompt <= kept1 | low1
        # Group 0: the question in full or (past the capacity) at low bits, the template at low bits,
        # every other role's tokens outside the window and the residual fill evicted.
        for position, role in enumerate(roles):
            if role == "user_question":
                assert position in kept0 | low0
            elif role != "template":
                assert position not in low0, (position, role)
        evicted0 = prompt - kept0 - low0 - window
        assert evicted0 and {roles[p] for p in evicted0} <= set(roles) - {"user_question", "template"}
        assert any(roles[p] == "template" for p in low0)
        # Bytes: what kv_stats counts is what the pool holds for the request.
        assert stats["kept_tokens"] == [len(kept0), len(kept1)]
        assert stats["lowbit_tokens"] == [len(low0), len(low1)]
        assert stats["lowbit_slots"][1] >= stats["lowbit_slots"][0] > 0
        # Admission reserves each group's storage budget, as if every token not kept in full were at low
        # bits (8 bf16 slots per 32-token k4v2 block); evicting only lowers what a request holds.
        for kept, slots, budget in zip(stats["kept_tokens"], stats["lowbit_slots"], stats["group_budgets"]):
            storage = budget + (1 - budget) * 8 / 32
            assert kept + slots <= storage * stats["full_tokens"] + 4 + 4 + 8
        # Concurrent mixed requests, some constrained, then everything comes back.
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(
                pool.map(
                    lambda i: requests.post(
                        f"{server.url}/generate",
                        json={
                            "text": PROMPT * (1 + i % 3),
                            "sampling_params": {
                                "temperature": 0,
                                "max_new_tokens": 24,
                                **({"json_schema": SCHEMA} if i % 2 else {}),
                            },
                        },
                        timeout=120,
                    ),
                    range(12),
                )
            )
        assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
        for r in results[1::2]:
            assert json.loads(r.json()["text"])["city"] in ("Paris", "Rome")
        assert requests.post(f"{server.url}/flush_cache", timeout=60).status_code == 200
        info = requests.get(f"{server.url}/server_info", timeout=30).json()
        usage = info["internal_states"][0]["sglang_pask"]["kv_pool"]
        assert usage["tokens_in_use"] == 0 and usage["lowbit_unstored_tokens"] == 0
        assert [(g["slots_in_use"], g["lowbit_slots_in_use"]) for g in usage["groups"]] == [(0, 0), (0, 0)]
        log = server.log_path.read_text()
        assert "leak" not in log.lower() and "Traceback" not in log, server.log_tail(60)
    finally:
        server.stop()
