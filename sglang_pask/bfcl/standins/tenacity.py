"""Stand-in for the ``tenacity`` package, installed only while ``bfcl_eval`` is imported, and only
when the real package is missing.

Why a stand-in: ``bfcl_eval.model_handler.utils`` imports four names from ``tenacity`` at module level
for its API-retry decorator (``retry_with_backoff``), which only the hosted-model handlers use. The
prompt and AST-checker functions that this project calls never reach it. Calling any name here raises
``RuntimeError`` so that an accidental use cannot pass silently.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _unavailable(name: str):
    def fail(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"tenacity.{name} is a stand-in (tenacity is not installed); bfcl_eval's API retry "
            "helpers are not available offline"
        )

    fail.__name__ = name
    return fail


retry = _unavailable("retry")
retry_if_exception_message = _unavailable("retry_if_exception_message")
retry_if_exception_type = _unavailable("retry_if_exception_type")
wait_random_exponential = _unavailable("wait_random_exponential")
