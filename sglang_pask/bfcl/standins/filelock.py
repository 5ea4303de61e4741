"""Stand-in for the ``filelock`` package, installed only while ``bfcl_eval`` is imported, and only
when the real package is missing.

Why a stand-in: ``bfcl_eval.utils`` imports ``FileLock`` at module level for its locked reads and
writes of result files. This project reads BFCL's data files itself (:mod:`sglang_pask.bfcl.data`) and
writes no BFCL result files, so no lock is ever taken; creating one raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import Any


class FileLock:
    """Raises on construction: no cross-process lock is available without the real package."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "filelock.FileLock is a stand-in (filelock is not installed); bfcl_eval's locked "
            "file I/O is not available offline"
        )
