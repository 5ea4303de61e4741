"""The two Triton kernel benchmarks (``bench/kernel_window_scores.py``, ``bench/kernel_skeleton_gather.py``)
through ``scripts/gpu_check.sh``, which runs both on a lent GPU: a dry run on small shapes here (each
benchmark's rows, metadata and the script's verdict), and a malformed shape refused by both.

Without CUDA the benchmarks time only torch and say why Triton is not timed, and the script exits 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()


def run_gpu_check(out: Path, shapes: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "SHAPES": shapes}
    return subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu_check")
    proc = run_gpu_check(out, "2x64 1x100")
    return {
        "out": out,
        "proc": proc,
        **{
            bench: json.loads((out / f"{bench}.json").read_text())
            for bench in (
                "kernel_window_scores",
                "kernel_skeleton_gather",
                "kernel_decode_attention",
                "structkv_prefill_stack",
                "decode_step_graph",
            )
        },
    }


def check_triton_columns(record: dict[str, Any], columns: tuple[str, ...]) -> None:
    """Without CUDA every Triton column is unmeasured and the refusal says why; with it, all are measured."""
    for row in record["rows"]:
        assert all((row[c] is None) != CUDA for c in columns), row
    if CUDA:
        assert record["triton_refused"] is None
    else:
        assert "no CUDA device" in record["triton_refused"]


def test_window_scores_bench_gives_one_row_per_shape_and_window(dry_run):
    record = dry_run["kernel_window_scores"]
    assert [(r["batch"], r["tokens"], r["window"]) for r in record["rows"]] == [
        (2, 64, 8),
        (1, 100, 8),
        (2, 64, 32),
        (1, 100, 32),
    ]
    assert all(r["reference_ms"] > 0 for r in record["rows"])
    check_triton_columns(record, ("triton_ms", "speedup", "triton_key_gbps", "max_abs_diff", "matches_reference"))
    meta = record["meta"]
    assert meta["shapes"] == [[2, 64], [1, 100]] and meta["q_heads"] == 32 and meta["head_dim"] == 128
    assert meta["repeats"] >= 1 and meta["commit"]
    assert "batch  tokens window" in (dry_run["out"] / "kernel_window_scores.txt").read_text()


def test_skeleton_gather_bench_gives_a_gather_and_a_scatter_row_per_shape(dry_run):
    rows = dry_run["kernel_skeleton_gather"]["rows"]
    assert [(r["op"], r["batch"], r["tokens"]) for r in rows] == [
        ("gather", 2, 64),
        ("scatter", 2, 64),
        ("gather", 1, 100),
        ("scatter", 1, 100),
    ]
    # per sequence: floor(0.2 * length) tokens by score plus the window of 8
    assert [r["kept"] for r in rows] == [2 * (12 + 8)] * 2 + [20 + 8] * 2
    assert all(r["reference_ms"] > 0 and r["index_ms"] > 0 for r in rows)
    check_triton_columns(
        dry_run["kernel_skeleton_gather"],
        ("triton_ms", "speedup_vs_reference", "speedup_vs_index", "triton_gbps", "bitwise_equal"),
    )
    assert dry_run["kernel_skeleton_gather"]["meta"]["dim"] == 4096


def test_decode_attention_bench_checks_every_configuration_against_the_reference(dry_run):
    record = dry_run["kernel_decode_attention"]
    configs = [row["config"] for row in record["rows"]]
    assert configs == (["contiguous"] if CUDA else []) + ["pergroup_full", "k4v2", "2bit", "drop"]
    checked = [row for row in record["rows"] if row["config"] != "contiguous"]
    assert all(row["matches_reference"] is True for row in checked), checked
    shares = {row["config"]: row["bytes_share"] for row in checked}
    assert shares["pergroup_full"] == 1.0 and shares["2bit"] < shares["k4v2"] < shares["drop"] < 1.0
    check_triton_columns_of_decode(record)


def check_triton_columns_of_decode(record: dict[str, Any]) -> None:
    """Without CUDA nothing is timed and the refusal says why; with it, every row is timed."""
    timed = [row["ms"] is not None for row in record["rows"]]
    if CUDA:
        assert record["triton_refused"] is None and all(timed)
    else:
        assert "no CUDA device" in record["triton_refused"] and not any(timed)


def test_structkv_prefill_stack_checks_the_skeleton_path_against_the_full_one(dry_run):
    record = dry_run["structkv_prefill_stack"]
    assert len(record["rows"]) == 1 and record["rows"][0]["matches_full_at_ratio_1"] is True
    row = record["rows"][0]
    assert row["skeleton_tokens"] < row["context"]
    if CUDA:
        assert record["refused"] is None and row["ratio"] is not None
    else:
        assert "no CUDA device" in record["refused"] and row["full_ms"] is None


def test_decode_step_graph_compares_the_layer_group_kernel_with_stock_attention(dry_run):
    record = dry_run["decode_step_graph"]
    assert [row["config"] for row in record["rows"]] == ["stock", "pergroup_full", "k4v2", "drop", "drop_scored"]
    assert record["rows"][1]["matches_stock"] is True
    timed = [row["step_ms"] is not None for row in record["rows"]]
    assert all(timed) if CUDA else (not any(timed) and "no CUDA device" in record["refused"])


def test_gpu_check_verdict_is_3_without_cuda_and_0_with_agreeing_kernels(dry_run):
    proc = dry_run["proc"]
    assert proc.returncode == (0 if CUDA else 3), proc.stdout + proc.stderr
    verdict = (dry_run["out"] / "verdict.txt").read_text()
    assert verdict.strip().endswith(f"verdict: exit status {proc.returncode}")
    assert "torch" in (dry_run["out"] / "env.txt").read_text()


def test_a_malformed_shape_is_refused_by_both_benches_and_fails_the_check(tmp_path):
    proc = run_gpu_check(tmp_path, "64by2")
    assert proc.returncode == 1
    for bench in ("kernel_window_scores", "kernel_skeleton_gather"):
        assert "'64by2' is not BATCHxTOKENS" in (tmp_path / f"{bench}.txt").read_text()
        assert f"{bench}: no results" in (tmp_path / "verdict.txt").read_text()
