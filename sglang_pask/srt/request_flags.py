"""The boolean sampling parameters sglang-pask adds to SGLang's ``/generate`` and how they travel.

* ``return_kv_roles``: the structural roles of the request's tokens (:mod:`.role_output`);
* ``return_kv_kept``: the positions each layer group still read at the request's last step
  (``meta_info["kv_stats"]["kept_positions"]``, :mod:`.layer_group_runtime`).

SGLang's ``SamplingParams`` knows neither, so the tokenizer manager's factory moves them into
``custom_params`` (which reaches the scheduler untouched) and the ``/generate`` contract check
accepts them if they are true or false.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.sampling.sampling_params import SamplingParams

ROLES_FLAG = "return_kv_roles"
KEPT_FLAG = "return_kv_kept"
FLAGS = (ROLES_FLAG, KEPT_FLAG)


def _flag_error(name: str, value: Any) -> Optional[str]:
    """Why ``value`` is not a valid value of flag ``name``, or None."""
    if isinstance(value, bool):
        return None
    return f"sampling parameter {name} must be true or false, got {value!r}"


def sampling_params_with_flags(**kwargs: Any) -> SamplingParams:
    """SGLang's SamplingParams, accepting the :data:`FLAGS` (carried in ``custom_params``)."""
    given = {name: kwargs.pop(name, None) for name in FLAGS}
    carried = {name: value for name, value in given.items() if value is not None}
    for name, value in carried.items():
        error = _flag_error(name, value)
        if error is not None:
            raise ValueError(error)
    if carried:
        kwargs["custom_params"] = {**(kwargs.get("custom_params") or {}), **carried}
    return SamplingParams(**kwargs)


def contract_error_with_flags(original: Any, body: Any) -> Optional[str]:
    """AROUND hook of SGLang's ``/generate`` contract check: the :data:`FLAGS` are known sampling
    parameters (true or false); everything else is checked by SGLang as before."""
    if not isinstance(body, dict):
        return original(body)
    params = body.get("sampling_params")
    param_list = params if isinstance(params, list) else [params]
    if not any(isinstance(p, dict) and any(name in p for name in FLAGS) for p in param_list):
        return original(body)
    stripped = []
    for p in param_list:
        if isinstance(p, dict):
            for name in FLAGS:
                if name in p:
                    error = _flag_error(name, p[name])
                    if error is not None:
                        return error
            p = {k: v for k, v in p.items() if k not in FLAGS}
        stripped.append(p)
    return original({**body, "sampling_params": stripped if isinstance(params, list) else stripped[0]})


def wants(req: Any, name: str) -> bool:
    """True if the scheduler-side request ``req`` asked for flag ``name``."""
    custom = getattr(req.sampling_params, "custom_params", None)
    return isinstance(custom, dict) and custom.get(name) is True
