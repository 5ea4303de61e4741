"""The two Triton kernel benchmarks (``bench/kernel_window_scores.py``, ``bench/kernel_skeleton_gather.py``)
run end to end on small ``--shapes``, as they would first run on a lent GPU, and refuse bad shapes.

Without CUDA they time only torch and say why Triton is not timed; the JSON they write is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

REPO_ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO_ROOT / "bench" / script), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def check_triton_columns(record: dict, columns: tuple[str, ...]) -> None:
    """Without CUDA every Triton column is unmeasured and the refusal says why; with it, all are measured."""
    for row in record["rows"]:
        assert all((row[c] is None) != CUDA for c in columns), row
    if CUDA:
        assert record["triton_refused"] is None
    else:
        assert "no CUDA device" in record["triton_refused"]


def test_window_scores_bench_writes_one_row_per_shape_and_window(tmp_path):
    out = tmp_path / "window_scores.json"
    proc = run_bench("kernel_window_scores.py", "--shapes", "2x64", "1x100", "--windows", "4", "8",
                     "--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert [(r["batch"], r["tokens"], r["window"]) for r in record["rows"]] == [
        (2, 64, 4), (1, 100, 4), (2, 64, 8), (1, 100, 8)]
    assert all(r["reference_ms"] > 0 for r in record["rows"])
    check_triton_columns(record, ("triton_ms", "speedup", "triton_key_gbps", "max_abs_diff"))
    meta = record["meta"]
    assert meta["shapes"] == [[2, 64], [1, 100]] and meta["q_heads"] == 4 and meta["head_dim"] == 16
    assert meta["repeats"] >= 1 and meta["commit"]
    assert "batch  tokens window" in proc.stdout


def test_skeleton_gather_bench_writes_a_gather_and_a_scatter_row_per_shape(tmp_path):
    out = tmp_path / "skeleton_gather.json"
    proc = run_bench("kernel_skeleton_gather.py", "--shapes", "2x64", "--dim", "32", "--ratio", "0.25",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert [(r["op"], r["batch"], r["tokens"]) for r in rows] == [("gather", 2, 64), ("scatter", 2, 64)]
    # per sequence: floor(0.25 * 64) tokens by score plus the window of 8
    assert all(r["kept"] == 2 * (16 + 8) for r in rows), rows
    assert all(r["reference_ms"] > 0 and r["index_ms"] > 0 for r in rows)
    check_triton_columns(record, ("triton_ms", "speedup_vs_reference", "speedup_vs_index", "triton_gbps",
                                  "bitwise_equal"))
    assert record["meta"]["shapes"] == [[2, 64]] and record["meta"]["dim"] == 32


@pytest.mark.parametrize("script", ["kernel_window_scores.py", "kernel_skeleton_gather.py"])
def test_a_malformed_shape_exits_2_naming_it(script):
    proc = run_bench(script, "--shapes", "64by2")
    assert proc.returncode == 2
    assert "'64by2' is not BATCHxTOKENS" in proc.stderr
