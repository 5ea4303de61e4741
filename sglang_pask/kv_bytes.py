"""``--kv-bytes``: the KV memory per request a user asks for, turned into ``--kv-budget``.

``--kv-budget`` is the share of a request's prompt tokens each layer group keeps at full precision;
``--kv-bytes`` is the share of full KV's bytes the request's prompt may take, at the served KV dtype.
The launcher turns the second into the first before anything else reads the config:

* ``--kv-dropped drop``: the tokens not kept cost nothing, so the budget is the byte share;
* ``--kv-dropped 2bit|k4v2`` with an untiered policy: every token not kept costs the format's share of a
  full slot, ``c = rows_per_block / BLOCK_TOKENS`` (bf16: 3/16 and 1/4), so ``b + (1 - b) c = bytes``
  gives ``b = (bytes - c) / (1 - c)``; a byte share at or below ``c`` is refused;
* ``--kv-policy pask`` with a low-bit ``--kv-dropped``: a *tiered* policy file (its low-bit tier in that
  format) solved by ``python -m sglang_pask.calibrate`` for this byte share; the file's own
  ``kv_budget`` is served. Without ``--pask-policy`` the file shipped for the served model and share is
  used; a share no file was solved for is refused with the shares that ship. A tiered file passed
  with ``--kv-budget`` instead is served only at the budget it was solved for (anything else would
  give neither its byte share nor a tested policy), and refused otherwise, naming ``--kv-bytes``.

The recent window, the attention sinks and the generated tokens come on top of the share, as they do
on top of ``--kv-budget``; ``bench.memory`` and ``bench.frontier`` measure the whole.

Pure Python (no sglang import).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from sglang_pask.config import KV_DROPPED_BITS, ConfigError, PaskConfig
from sglang_pask.sglang_argv import flag_value

#: Bytes per element of the KV dtypes the layer-group pool serves, by ``--dtype`` / ``torch_dtype`` name.
_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_itemsize(sglang_argv: list[str], model_config: Optional[dict]) -> int:
    """Bytes per KV element the server will store: ``--kv-cache-dtype`` unless ``auto``, else ``--dtype``
    unless ``auto``, else the model's ``torch_dtype`` (bf16 when unknown)."""
    for flag in ("--kv-cache-dtype", "--dtype"):
        value = (flag_value(sglang_argv, flag) or "auto").strip().lower()
        if value != "auto":
            return _ITEMSIZE.get(value, 2)
    model_dtype = str((model_config or {}).get("torch_dtype") or "bfloat16").lower()
    return _ITEMSIZE.get(model_dtype, 2)


def lowbit_cost(kv_dropped: str, itemsize: int) -> float:
    """A low-bit token's share of a full-precision slot under ``kv_dropped`` (0 under ``drop``)."""
    from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS, rows_per_block

    bits = KV_DROPPED_BITS.get(kv_dropped)
    return 0.0 if bits is None else rows_per_block(*bits, itemsize) / BLOCK_TOKENS


def budget_for_bytes(kv_bytes: float, kv_dropped: str, itemsize: int) -> float:
    """The ``--kv-budget`` of an untiered policy whose prompt takes ``kv_bytes`` of full KV's bytes.

    Raises
    ------
    ConfigError
        If the low-bit format alone costs ``kv_bytes`` or more.
    """
    cost = lowbit_cost(kv_dropped, itemsize)
    if kv_bytes <= cost:
        raise ConfigError(
            f"--kv-bytes {kv_bytes:g}: with --kv-dropped {kv_dropped} every prompt token not kept in full still "
            f"costs {cost:.4g} of a full slot at this KV dtype, so the prompt cannot take less than that. Raise "
            "--kv-bytes, evict instead (--kv-dropped drop), or serve a tiered PASK policy (--kv-policy pask), "
            "which evicts some roles' tokens and keeps others at low bits"
        )
    return (kv_bytes - cost) / (1.0 - cost)


def resolve_kv_bytes(config: PaskConfig, itemsize: int, model_name: str) -> PaskConfig:
    """``config`` with ``--kv-budget`` (and for tiered PASK ``--pask-policy``) set from ``--kv-bytes``;
    ``config`` itself when it has none.

    Raises
    ------
    ConfigError
        A byte share below a low-bit format's cost, a tiered policy file solved for another share or
        format, or no shipped tiered file for the share; without ``--kv-bytes``, a tiered policy file
        with a ``--kv-budget`` other than its own.
    """
    if config.kv_bytes is None:
        _check_tiered_budget(config)
        return config
    if config.kv_policy != "pask" or config.kv_dropped == "drop":
        budget = budget_for_bytes(config.kv_bytes, config.kv_dropped, itemsize)
        return dataclasses.replace(config, kv_budget=budget)
    from sglang_pask.policy import PolicyFileError
    from sglang_pask.policy.pask_file import policy_file_tiers
    from sglang_pask.policy.resolve import shipped_tiered_bytes, shipped_tiered_file

    path: Optional[Path] = Path(config.pask_policy) if config.pask_policy is not None else None
    if path is None:
        path = shipped_tiered_file(model_name, config.kv_dropped, config.kv_bytes)
        if path is None:
            shipped = shipped_tiered_bytes(model_name, config.kv_dropped)
            raise ConfigError(
                f"--kv-bytes {config.kv_bytes:g}: no tiered PASK policy ships for model {model_name!r} with "
                f"--kv-dropped {config.kv_dropped} at that share"
                + (f" (shipped: {', '.join(f'{b:g}' for b in shipped)})" if shipped else "")
                + "; solve one with python -m sglang_pask.calibrate --refit FILE --kv-dropped "
                f"{config.kv_dropped} --kv-bytes {config.kv_bytes:g} --out NEW.json and pass it with --pask-policy"
            )
    try:
        tiers = policy_file_tiers(path)
    except PolicyFileError as err:
        raise ConfigError(f"--pask-policy: {err}") from None
    if tiers is None:
        raise ConfigError(
            f"--kv-bytes with --kv-policy pask and --kv-dropped {config.kv_dropped} needs a tiered policy file "
            f'(one with "lowbit" shares); {path} has none'
        )
    if abs(tiers.kv_bytes - config.kv_bytes) > 1e-6:
        raise ConfigError(
            f"--kv-bytes {config.kv_bytes:g}: the PASK policy file {path} was solved for {tiers.kv_bytes:g} "
            f"(solve it again: python -m sglang_pask.calibrate --refit {path} --kv-dropped {tiers.lowbit_format} "
            f"--kv-bytes {config.kv_bytes:g} --out NEW.json)"
        )
    return dataclasses.replace(config, kv_budget=tiers.kv_budget, pask_policy=str(path))


def _check_tiered_budget(config: PaskConfig) -> None:
    """A tiered ``--pask-policy`` given with ``--kv-budget`` must be served at its own budget."""
    if config.kv_policy != "pask" or config.pask_policy is None:
        return
    from sglang_pask.policy import PolicyFileError
    from sglang_pask.policy.pask_file import policy_file_tiers

    try:
        tiers = policy_file_tiers(config.pask_policy)
    except PolicyFileError as err:
        raise ConfigError(f"--pask-policy: {err}") from None
    if tiers is not None and abs(tiers.kv_budget - config.kv_budget) > 1e-6:
        raise ConfigError(
            f"--kv-budget {config.kv_budget:g}: the tiered PASK policy file {config.pask_policy} was solved for "
            f"--kv-bytes {tiers.kv_bytes:g}, which serves at --kv-budget {tiers.kv_budget:g}; pass --kv-bytes "
            f"{tiers.kv_bytes:g} instead of --kv-budget"
        )
