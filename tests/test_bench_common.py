"""``bench/common.py``: the header every result file starts with, a clean exit on SIGTERM, and the
kernel benchmarks' shared options and metadata."""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.common import (
    kernel_run_meta,
    kernel_shape,
    markdown_header,
    optional_cell,
    read_json_files,
    refuse_flags_given,
    run_header,
)


def test_run_header_names_the_command_date_machine_and_commit():
    header = run_header("python -m bench.memory", ["--policies", "pask", "--server-args", "--kv-budget 0.33"])
    assert header["command"] == "python -m bench.memory --policies pask --server-args '--kv-budget 0.33'"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", header["date"])
    assert header["machine"]["platform"] and header["machine"]["processor"] and header["machine"]["nproc"] >= 1
    assert re.fullmatch(r"([0-9a-f]{40}(-dirty)?|unknown)", header["commit"])
    assert run_header("python -m bench.memory", [])["command"] == "python -m bench.memory"


def test_markdown_header_lists_the_run_header():
    header = run_header("python -m bench.long_context", ["--lengths", "2048"])
    text = markdown_header("Long-context accuracy", header)
    lines = text.splitlines()
    assert lines[0] == "# Long-context accuracy"
    assert "- command: `python -m bench.long_context --lengths 2048`" in lines
    assert f"- date: {header['date']}" in lines and f"- commit: {header['commit']}" in lines
    assert f"nproc {header['machine']['nproc']}" in text and text.endswith("\n\n")


def test_sigterm_runs_the_benchmarks_finally_blocks(tmp_path):
    marker = tmp_path / "stopped"
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from bench.common import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').write('servers stopped')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 143
    assert marker.read_text() == "servers stopped"


def test_kernel_shape_reads_batch_x_tokens_and_names_what_it_refuses():
    assert kernel_shape("8x4096") == (8, 4096)
    assert kernel_shape("1X32768") == (1, 32768)
    for bad in ("8", "8x", "x4096", "0x64", "8x0", "-1x64", "8x4096x2", "ax64", "8 x 64", "\u00b2x64"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            kernel_shape(bad)


def test_kernel_run_meta_records_the_software_the_options_and_the_commit():
    meta = kernel_run_meta(torch.device("cpu"), 3, {"dim": 64, "shapes": [(2, 16)]})
    assert meta["device"] and meta["torch"] == torch.__version__ and meta["triton"]
    assert meta["dim"] == 64 and meta["shapes"] == [(2, 16)] and meta["repeats"] == 3
    assert re.fullmatch(r"([0-9a-f]{40}(-dirty)?|unknown)", meta["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", meta["date"])


def test_optional_cell_formats_a_value_or_marks_it_unmeasured():
    assert optional_cell(1.23456, ".2f") == "1.23"
    assert optional_cell(None, ".2f") == "-"


def test_read_json_files_returns_each_file_and_refuses_a_missing_or_non_json_one(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="bench")
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text('{"results": [1]}')
    bad.write_text("{not json")
    assert read_json_files(parser, [str(good), str(good)]) == [{"results": [1]}, {"results": [1]}]
    for names, message in (
        ([str(good), str(tmp_path / "gone.json")], "--from-json: file not found"),
        ([str(bad)], "is not JSON"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            read_json_files(parser, names)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_refuse_flags_given_names_each_flag_set_away_from_its_default(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--first-item", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=["full"])
    parser.add_argument("--json")
    refuse_flags_given(parser, parser.parse_args(["--json", "x", "--modes", "full"]), ["first_item", "modes"], "why")
    with pytest.raises(SystemExit) as exit_info:
        refuse_flags_given(
            parser, parser.parse_args(["--first-item", "3", "--modes", "a"]), ["first_item", "modes"], "not in a replay"
        )
    assert exit_info.value.code == 2
    assert "error: --first-item, --modes: not in a replay" in capsys.readouterr().err
