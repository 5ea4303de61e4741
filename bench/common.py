"""What every benchmark here shares: the commit a result came from, a result's header, timing helpers
and the exact test of two methods answering the same items.

Standard library only at import (torch is imported where a timing needs it), so the kernel
benchmarks still run from a bare checkout on a machine without this package installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """HEAD of the checkout, with ``-dirty`` when tracked files differ; ``unknown`` outside git."""

    def git(*cmd: str) -> str:
        proc = subprocess.run(["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)``, so a benchmark stopped with ``kill`` still runs its
    ``finally`` blocks: the servers it started are stopped (and continued first, if it froze them)
    instead of being left behind holding memory. Call from the main thread, before any server starts."""

    def raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)


def run_exit_status(error: str | None, kept: str | None) -> int:
    """A run's exit status: 0 when it finished; otherwise print ``error`` and, when the run measured
    something before it, ``kept`` (where that went), both to stderr, and return 1."""
    if error is None:
        return 0
    print(f"error: {error}", file=sys.stderr)
    if kept is not None:
        print(kept, file=sys.stderr)
    return 1


def run_header(prog: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """The header of a result file: the command as typed (``prog`` plus ``argv``, or the process's
    arguments when ``argv`` is None), the UTC date, the machine and :func:`git_commit`."""
    args = sys.argv[1:] if argv is None else argv
    return {
        "command": " ".join([prog, *(shlex.quote(a) for a in args)]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "nproc": os.cpu_count(),
        },
        "commit": git_commit(),
    }


def markdown_header(title: str, header: dict[str, Any]) -> str:
    """A result file's Markdown opening: ``title`` and the :func:`run_header` fields as a list."""
    machine = header["machine"]
    return (
        "\n".join(
            [
                f"# {title}",
                "",
                f"- command: `{header['command']}`",
                f"- date: {header['date']}",
                f"- machine: {machine['platform']} ({machine['processor']}), nproc {machine.get('nproc', '?')}",
                f"- commit: {header['commit']}",
                "",
            ]
        )
        + "\n"
    )


def median_ms(fn: Callable[[], object], repeats: int, device: Any) -> float:
    """Median wall time of ``fn`` in milliseconds over ``repeats`` calls, after one warm-up call
    (which also compiles); CUDA work is synchronized around each call on a ``cuda`` device."""
    import torch

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def triton_refusal(device: Any, interpreted: bool, timed_instead: str) -> str | None:
    """Why Triton kernels cannot be timed here (``None`` when they can); ``timed_instead`` names
    what the benchmark times alone then, e.g. ``"the reference"``."""
    if device.type != "cuda":
        return (
            "Triton not timed: no CUDA device. On a CPU Triton runs only in its interpreter "
            f"(TRITON_INTERPRET=1), whose timings are meaningless; only {timed_instead} is timed."
        )
    if interpreted:
        return "Triton not timed: TRITON_INTERPRET=1 is set, so the kernels would run in the interpreter."
    return None


def read_json_files(parser: argparse.ArgumentParser, names: Sequence[str], flag: str = "--from-json") -> list[Any]:
    """The parsed contents of each of ``names`` (earlier runs' ``--json`` files), in order; a missing
    file or one that is not JSON is a usage error (``parser.error``: exit 2) naming the flag and file."""
    records = []
    for name in names:
        path = Path(name)
        if not path.is_file():
            parser.error(f"{flag}: file not found: {path}")
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            parser.error(f"{flag}: {path} is not JSON ({exc})")
    return records


def refuse_flags_given(
    parser: argparse.ArgumentParser, args: argparse.Namespace, dests: Sequence[str], because: str
) -> None:
    """A usage error (``parser.error``: exit 2) naming every flag of ``dests`` (argparse destinations,
    flag ``--a-b`` for ``a_b``) whose value differs from its default, ``because`` saying why such flags
    mean nothing here (e.g. a replay of earlier runs, which starts no server)."""
    given = [f"--{dest.replace('_', '-')}" for dest in dests if getattr(args, dest) != parser.get_default(dest)]
    if given:
        parser.error(f"{', '.join(given)}: {because}")


def positive_int(text: str) -> int:
    """``argparse`` type: an integer >= 1 (a count of items or repeats)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """``argparse`` type: an integer >= 0 (an index)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is below {minimum}")
    return value


def kernel_shape(text: str) -> tuple[int, int]:
    """``argparse`` type of a kernel benchmark's ``--shapes`` entry: ``BATCHxTOKENS`` (e.g. ``8x4096``),
    both positive integers.

    Raises
    ------
    argparse.ArgumentTypeError
        On anything else (the message names the entry).
    """
    batch, sep, tokens = text.lower().partition("x")
    if sep and batch.isdecimal() and tokens.isdecimal() and int(batch) > 0 and int(tokens) > 0:
        return int(batch), int(tokens)
    raise argparse.ArgumentTypeError(f"{text!r} is not BATCHxTOKENS with two positive integers (e.g. 8x4096)")


def kernel_run_meta(device: Any, repeats: int, options: dict[str, Any]) -> dict[str, Any]:
    """What a kernel benchmark's numbers depend on: the device, torch, triton and Python versions, the
    shape ``options`` it ran with, ``repeats``, the commit and the UTC date."""
    import torch
    import triton

    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        **options,
        "repeats": repeats,
        "commit": git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def optional_cell(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted by ``spec``, or ``-`` where it was not measured."""
    return "-" if value is None else format(value, spec)


def exact_mcnemar_p(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar (sign) test of two methods run on the same items.

    Parameters
    ----------
    only_first, only_second : int
        Items only the first method got right, and items only the second did (the items both or
        neither got right carry no evidence either way).

    Returns
    -------
    float
        The probability, were both methods equally good, of a split at least this lopsided:
        1.0 when they never disagree.
    """
    if only_first < 0 or only_second < 0:
        raise ValueError(f"counts must be >= 0, got {only_first} and {only_second}")
    disagreements = only_first + only_second
    tail = sum(math.comb(disagreements, k) for k in range(min(only_first, only_second) + 1))
    return min(1.0, 2.0 * tail / 2.0**disagreements)


def load_kernel(name: str) -> Any:
    """The module ``kernels/<name>.py`` imported from the checkout as part of a package
    (``pask_kernels``), so its relative imports work without an install of this project (the GPU
    benchmark machine has torch and triton only)."""
    import importlib
    import importlib.util

    if "pask_kernels" not in sys.modules:
        folder = Path(__file__).resolve().parents[1] / "kernels"
        spec = importlib.util.spec_from_file_location(
            "pask_kernels", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["pask_kernels"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"pask_kernels.{name}")


def cuda_median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median time of ``fn`` on the current CUDA device in milliseconds, by CUDA events around each
    of ``repeats`` calls after ``warmup`` calls (which also compile)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def held_kv_bytes(stats: dict, bytes_per_slot: Sequence[int]) -> tuple[int, int]:
    """The bytes a request's layer groups held at its last step, and those of full KV of the same length.

    Parameters
    ----------
    stats : dict
        Its ``meta_info["kv_stats"]``: ``full_tokens``, ``kept_tokens`` (one per group) and, under a
        low-bit ``--kv-dropped``, ``lowbit_slots`` (one per group; absent: zeros).
    bytes_per_slot : sequence of int
        Each group's bytes per slot (``/server_info``).

    Returns
    -------
    tuple[int, int]
        ``sum_g (kept_g + lowbit_slots_g) * bytes_g`` and ``full_tokens * sum_g bytes_g``.

    Raises
    ------
    ValueError
        If the stats have another number of groups than ``bytes_per_slot``.
    """
    kept = stats["kept_tokens"]
    lowbit = stats.get("lowbit_slots") or [0] * len(kept)
    if not len(kept) == len(lowbit) == len(bytes_per_slot):
        raise ValueError(
            f"kv_stats has {len(kept)} groups (lowbit_slots {len(lowbit)}), the pool {len(bytes_per_slot)}"
        )
    held = sum((k + s) * b for k, s, b in zip(kept, lowbit, bytes_per_slot))
    return held, stats["full_tokens"] * sum(bytes_per_slot)


def kv_share(stats: dict, bytes_per_slot: Sequence[int]) -> float:
    """The bytes a request's layer groups held, as a share of full KV of the same length
    (:func:`held_kv_bytes`)."""
    held, full = held_kv_bytes(stats, bytes_per_slot)
    return held / full
