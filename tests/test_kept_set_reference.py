"""``return_kv_kept`` and ``bench.kept_set_reference``: a compressed server's answers replayed in
transformers with attention masked to the positions the server says each layer group kept.

The server test runs a real SGLang server on the tiny random model (mechanics: whether the answer is
computed from exactly the reported KV, not whether it is good)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import pytest
import requests
import torch

from bench.kept_set_reference import (
    ask,
    build_parser,
    checked_server_args,
    compare_item,
    group_masks,
    layer_groups_of,
    load_reference,
    main,
    replay_logprobs,
    server_layer_groups,
)
from sglang_pask.server_process import ServerProcess

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
SERVER_FLAGS = [
    "--kv-policy",
    "snapkv",
    "--kv-budget",
    "0.3",
    "--kv-layer-groups",
    "0-0,1-1",
    "--kv-window",
    "4",
    "--kv-decode",
    "keep",
    "--dtype",
    "float32",
    "--disable-radix-cache",
]


def test_group_masks_read_the_kept_prompt_positions_and_every_answer_position():
    masks = group_masks(prompt_len=5, total_len=8, kept=[[0, 3, 4, 5, 6], [1, 2, 3, 4]], dtype=torch.float32)
    assert len(masks) == 2 and masks[0].shape == (1, 1, 8, 8)
    reads = [m[0, 0] == 0 for m in masks]
    for read in reads:
        # Prompt rows: plain causal attention over the whole prompt.
        assert torch.equal(read[:5, :5], torch.ones(5, 5, dtype=torch.bool).tril())
        assert not read[:, 5:].triu(1).any() and not read[:5, 5:].any()
        # Answer rows read every answer position up to their own.
        assert torch.equal(read[5:, 5:], torch.ones(3, 3, dtype=torch.bool).tril())
    assert reads[0][5:, :5].tolist() == [[True, False, False, True, True]] * 3
    assert reads[1][5:, :5].tolist() == [[False, True, True, True, True]] * 3
    assert float(masks[0][0, 0, 5, 1]) == torch.finfo(torch.float32).min


def test_layer_groups_of_reads_the_servers_group_layers():
    assert layer_groups_of(["0-1", "2-2", "3-5"]) == [0, 0, 1, 2, 2, 2]
    for bad in (["1-2"], ["0-1", "3-4"], ["0-2", "3-1"]):
        with pytest.raises(ValueError, match="cover the layers in order"):
            layer_groups_of(bad)


@pytest.mark.parametrize(
    "server_args, message",
    [
        ("--kv-policy pask --kv-budget 0.3", "needs --kv-decode keep"),
        ("--kv-policy pask --kv-decode compress", "needs --kv-decode keep"),
        ("--kv-policy pask --kv-decode keep --structkv", "--structkv prunes the prefill"),
        ("--kv-policy snapkv --kv-decode keep --kv-dropped 2bit", "this replay reads only the full-precision kept set"),
        ("--kv-budget 0.3 --kv-decode keep", "needs a --kv-policy"),
        ("--kv-policy pask --kv-decode keep --model-path m", "give the model with --model-path"),
        ("--kv-policy pask --kv-decode keep --dtype int8", "--dtype must be one of"),
    ],
)
def test_server_args_that_no_replay_can_match_are_usage_errors(server_args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        checked_server_args(build_parser(), server_args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_an_unknown_category_is_a_usage_error_before_any_server_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--categories", "nope"])
    assert exit_info.value.code == 2 and "unknown BFCL category nope" in capsys.readouterr().err


def test_server_args_get_float32_and_the_radix_cache_off_unless_given():
    parser = build_parser()
    flags = checked_server_args(parser, "--kv-policy snapkv --kv-decode keep")
    assert flags[-3:] == ["--dtype", "float32", "--disable-radix-cache"]
    flags = checked_server_args(parser, "--kv-policy snapkv --kv-decode keep --dtype bfloat16 --disable-radix-cache")
    assert flags.count("--dtype") == 1 and flags.count("--disable-radix-cache") == 1


def test_masks_that_keep_everything_replay_exactly_the_unmasked_pass(tiny_model_dir: Path):
    model = load_reference(str(tiny_model_dir), torch.float32)
    ids = random.Random(0).sample(range(300, 3000), 12)
    everything = [list(range(12))] * 2
    masks = group_masks(8, 12, everything, torch.float32)
    plain = replay_logprobs(model, ids, 8, None)
    masked = replay_logprobs(model, ids, 8, masks)
    assert torch.allclose(plain[0], masked[0], atol=1e-6) and torch.equal(plain[1], masked[1])
    dropped = group_masks(8, 12, [[0, 6, 7]] * 2, torch.float32)
    assert not torch.allclose(plain[0], replay_logprobs(model, ids, 8, dropped)[0], atol=1e-3)


@pytest.fixture(scope="module")
def keep_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("kept") / "server.log"
    server = ServerProcess(["--model-path", str(tiny_model_dir), *SERVER_FLAGS], log)
    try:
        yield server.wait_ready(timeout_s=300)
    finally:
        server.stop()


def prompt_ids(tiny_model_dir: Path, seed: int) -> list[int]:
    from transformers import AutoTokenizer

    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 120)))
    return AutoTokenizer.from_pretrained(tiny_model_dir)(text, add_special_tokens=False)["input_ids"]


@pytest.mark.server
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_compressed_servers_answers_follow_from_exactly_the_kv_it_reports(keep_server, tiny_model_dir, seed):
    model = load_reference(str(tiny_model_dir), torch.float32)
    group_of_layer = server_layer_groups(keep_server.url)
    assert group_of_layer == [0, 1]
    prompt = prompt_ids(tiny_model_dir, seed)
    answer, logprobs, kept = ask(keep_server.url, prompt, max_new_tokens=12, timeout_s=120)
    assert len(answer) == len(logprobs) >= 2 and len(kept) == 2
    replay = compare_item(model, group_of_layer, f"seed{seed}", prompt, answer, logprobs, kept)
    assert all(share < 0.5 for share in replay.kept_share)  # the prompt was compressed ...
    assert replay.answer_kept  # ... and, under --kv-decode keep, every answer token stayed
    assert replay.masked_max_abs_diff < 1e-3
    assert replay.masked_greedy_agree == len(answer)
    assert replay.full_max_abs_diff > 100 * replay.masked_max_abs_diff  # the check has teeth


@pytest.mark.server
def test_kept_positions_are_reported_only_when_asked_and_the_flag_must_be_boolean(keep_server, tiny_model_dir):
    body = {"input_ids": prompt_ids(tiny_model_dir, 4), "sampling_params": {"temperature": 0, "max_new_tokens": 3}}
    plain = requests.post(f"{keep_server.url}/generate", json=body, timeout=120)
    assert plain.status_code == 200 and "kept_positions" not in plain.json()["meta_info"]["kv_stats"]
    for value in ("yes", 1):
        bad = {**body, "sampling_params": {**body["sampling_params"], "return_kv_kept": value}}
        response = requests.post(f"{keep_server.url}/generate", json=bad, timeout=120)
        assert response.status_code == 400 and "return_kv_kept must be true or false" in response.text
    both = {**body, "sampling_params": {**body["sampling_params"], "return_kv_kept": True, "return_kv_roles": True}}
    meta = requests.post(f"{keep_server.url}/generate", json=both, timeout=120).json()["meta_info"]
    stats = meta["kv_stats"]
    assert [len(p) for p in stats["kept_positions"]] == stats["kept_tokens"]
    assert len(meta["kv_prompt_roles"]) == len(body["input_ids"])
    assert requests.get(f"{keep_server.url}/health", timeout=30).status_code == 200


@pytest.mark.server
def test_inspect_marks_what_a_compressed_server_dropped(keep_server, tmp_path):
    import subprocess
    import sys

    page = tmp_path / "kept.html"
    prompt = " ".join(WORDS * 4)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_pask.inspect",
            "--url",
            keep_server.url,
            "--prompt",
            prompt,
            "--max-new-tokens",
            "4",
            "--no-color",
            "--html",
            str(page),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "|tiers:--]" in result.stdout  # at a budget of 0.3 both groups evicted some prompt tokens
    assert "line-through" in page.read_text() and "group 1: full / low-bit" in page.read_text()
