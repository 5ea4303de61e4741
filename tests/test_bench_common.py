"""``bench/common.py``: the header every result file starts with, and a clean exit on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from bench.common import markdown_header, run_header


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
