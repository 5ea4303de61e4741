"""The boolean sampling parameters sglang-pask adds to SGLang's ``/generate``: names, values, lookup.

* ``return_kv_roles``: the structural roles of the request's tokens (:mod:`sglang_pask.srt.output`);
* ``return_kv_kept``: the positions each layer group still read at the request's last step
  (``meta_info["kv_stats"]["kept_positions"]``, :mod:`sglang_pask.api.kv_stats`).

SGLang's ``SamplingParams`` knows neither, so the tokenizer manager's factory moves them into
``custom_params`` (which reaches the scheduler untouched) and the ``/generate`` contract check
accepts them if they are true or false (both in :mod:`sglang_pask.srt.contract`); :func:`wants`
reads them back on the scheduler side.

Pure Python (no sglang import).
"""

from __future__ import annotations

from typing import Any, Optional

ROLES_FLAG = "return_kv_roles"
KEPT_FLAG = "return_kv_kept"
FLAGS = (ROLES_FLAG, KEPT_FLAG)


def flag_error(name: str, value: Any) -> Optional[str]:
    """Why ``value`` is not a valid value of flag ``name``, or None."""
    if isinstance(value, bool):
        return None
    return f"sampling parameter {name} must be true or false, got {value!r}"


def wants(req: Any, name: str) -> bool:
    """True if the scheduler-side request ``req`` asked for flag ``name``."""
    custom = getattr(req.sampling_params, "custom_params", None)
    return isinstance(custom, dict) and custom.get(name) is True
