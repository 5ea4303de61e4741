"""Fail loudly at start-up: every hook must apply in every SGLang process, and the installed SGLang
must be the pinned one (issue 51, item 1). Each hook check runs in a fresh interpreter, so the
pytest process's HookRegistry stays untouched."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pask.config import ConfigError
from sglang_pask.config_rules import ALLOW_OTHER_SGLANG_ENV, PINNED_SGLANG, check_sglang_version

LOAD_PLUGINS = """
import sys
from sglang_pask.config import PaskConfig
PaskConfig(structkv={structkv}).publish()
import sglang_pask.srt.hooks as hooks
{change}
from sglang.srt.plugins import load_plugins
load_plugins()
print("still running")
"""


def load_plugins(structkv: bool = False, change: str = "") -> subprocess.CompletedProcess[str]:
    code = LOAD_PLUGINS.format(structkv=structkv, change=change)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)


def test_every_hook_applies_and_one_line_says_how_many():
    for structkv, count in ((False, 22), (True, 25)):  # StructKV adds the Qwen2, Qwen3 and Llama layer loops
        proc = load_plugins(structkv)
        assert proc.returncode == 0 and "still running" in proc.stdout, proc.stderr[-2000:]
        assert re.search(rf"^sglang-pask: {count} hooks applied \(MainProcess, pid \d+\)$", proc.stderr, re.M)


def test_a_target_sglang_cannot_patch_stops_the_process_naming_it():
    proc = load_plugins(change='hooks._PREFILL_ADDER = "sglang.srt.managers.schedule_policy.NoSuchAdder"')
    assert proc.returncode == 1 and "still running" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "sglang-pask: SGLang could not apply 1 of its 22 hooks (the installed SGLang differs from the pinned one, "
        "or a target moved): sglang.srt.managers.schedule_policy.NoSuchAdder.__init__"
    )


def test_a_registration_that_fails_stops_the_process():
    proc = load_plugins(change="hooks.register = lambda config: (_ for _ in ()).throw(ImportError('no module x'))")
    assert proc.returncode == 1 and "still running" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "sglang-pask: could not register its hooks in SGLang (ImportError: no module x)"
    )


def test_the_pin_is_pyprojects():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"sglang=={PINNED_SGLANG}"' in pyproject


@pytest.mark.parametrize(
    "installed, environ, message",
    [
        (
            "0.5.24",
            {},
            f"sglang 0.5.24 is installed, but sglang-pask's hooks are written against sglang {PINNED_SGLANG}",
        ),
        ("0.5.24", {ALLOW_OTHER_SGLANG_ENV: "0"}, "set SGLANG_PASK_ALLOW_OTHER_SGLANG=1 to try anyway"),
        (None, {}, f"sglang is not installed: sglang-pask needs sglang=={PINNED_SGLANG}"),
    ],
)
def test_another_sglang_is_refused(installed, environ, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_sglang_version(installed, environ)


def test_the_pinned_sglang_or_the_override_passes():
    check_sglang_version(PINNED_SGLANG, {})
    check_sglang_version("0.6.0", {ALLOW_OTHER_SGLANG_ENV: "1"})
