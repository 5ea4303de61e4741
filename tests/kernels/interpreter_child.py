"""Run a kernel test's Triton side in a child process under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when it is first imported, so the interpreted kernels run in a fresh
interpreter: the test file itself, executed as a script with an inputs file and an outputs file, which
its ``__main__`` block reads and writes. The pytest process and later tests keep their environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch


def run_in_interpreter(script: str, inputs: Any, seed: int, timeout_s: float = 600) -> dict[str, Any]:
    """Save ``inputs``, run ``python script INPUTS OUTPUTS`` under ``TRITON_INTERPRET=1`` and load what it wrote.

    A failing child fails the test with its output and the seed that replays the random data.
    """
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save(inputs, src)
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        proc = subprocess.run(
            [sys.executable, script, str(src), str(dst)],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert proc.returncode == 0, f"interpreter run failed (seed {seed}):\n{proc.stdout}\n{proc.stderr}"
        return torch.load(dst)
