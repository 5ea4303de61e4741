"""Output paths of the long-running commands are checked when the arguments are parsed."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from sglang_pask.cli_paths import output_file


def test_a_file_in_an_existing_directory_is_accepted_as_given(tmp_path):
    assert output_file(str(tmp_path / "out.json")) == str(tmp_path / "out.json")
    (tmp_path / "old.json").write_text("{}")
    assert output_file(str(tmp_path / "old.json")) == str(tmp_path / "old.json")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing" / "out.json", "does not exist"),
        (lambda d: d, "is a directory"),
    ],
)
def test_paths_that_cannot_be_written_are_refused(tmp_path, make, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        output_file(str(make(tmp_path)))


@pytest.mark.parametrize(
    "module", ["bench.bfcl", "bench.long_context", "bench.memory", "bench.order_dependence", "bench.pivot_profile"]
)
def test_benchmarks_refuse_an_unwritable_json_path_before_running(module):
    run = subprocess.run(
        [sys.executable, "-m", module, "--json", "/no/such/directory/out.json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert (
        "argument --json: cannot write /no/such/directory/out.json: directory /no/such/directory does not exist"
        in run.stderr
    )
