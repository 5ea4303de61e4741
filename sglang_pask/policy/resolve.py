"""The configured policy instance: a registry name, plus the calibrated table for ``pask``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .base import KVPolicy
from .pask_file import CALIBRATED_DECODE, PolicyFileError, load_policy_file
from .registry import get_policy, policy_options

# Calibrated PASK policies shipped with the package: ``<model folder name>.json`` for
# ``--kv-decode compress``, ``<model folder name>.keep.json`` for ``--kv-decode keep``,
# ``<model folder name>.lowbit.json`` for ``--kv-decode lowbit`` (calibrated for ``keep``).
CALIBRATED_DIR = Path(__file__).parent / "calibrated"
_SHIPPED_SUFFIX = {"compress": ".json", "keep": ".keep.json", "lowbit": ".lowbit.json"}


def shipped_policy_file(model_name: str, kv_decode: str = "compress") -> Optional[Path]:
    """The shipped PASK policy file for ``model_name`` served with ``--kv-decode kv_decode``, if any."""
    path = CALIBRATED_DIR / f"{model_name}{_SHIPPED_SUFFIX[kv_decode]}"
    return path if path.is_file() else None


def shipped_tiered_file(model_name: str, lowbit_format: str, kv_bytes: float) -> Optional[Path]:
    """The shipped tiered PASK policy file for ``model_name``, its low-bit tier stored as
    ``lowbit_format``, solved for ``kv_bytes`` (``<model>.tiers-<format>-<bytes>.json``), if one ships."""
    path = CALIBRATED_DIR / f"{model_name}.tiers-{lowbit_format}-{kv_bytes:g}.json"
    return path if path.is_file() else None


def shipped_tiered_bytes(model_name: str, lowbit_format: str) -> list[float]:
    """The ``kv_bytes`` of every tiered file shipped for ``model_name`` and ``lowbit_format``, ascending."""
    prefix = f"{model_name}.tiers-{lowbit_format}-"
    return sorted(float(p.name[len(prefix) : -len(".json")]) for p in CALIBRATED_DIR.glob(f"{prefix}*.json"))


def build_policy(
    name: str,
    pask_policy: Optional[str],
    num_layers: int,
    layer_ranges: Sequence[range],
    model_name: str,
    kv_decode: str = "compress",
    args: tuple[tuple[str, str], ...] = (),
    kv_dropped: Optional[str] = None,
) -> KVPolicy:
    """The policy for ``--kv-policy name`` (and ``--pask-policy``) on the served model, whose
    ``--kv-decode`` is ``kv_decode`` and ``--kv-dropped`` is ``kv_dropped`` (a tiered policy file is
    checked against it when given), with the ``--kv-policy-args`` pairs ``args`` (typed by
    :func:`~.registry.policy_options`).

    Raises
    ------
    ValueError
        An unknown policy or option; for ``pask``, a missing or unfit policy file
        (:class:`PolicyFileError`).
    """
    options = policy_options(name, args)
    if name != "pask":
        return get_policy(name, **options)
    path = Path(pask_policy) if pask_policy is not None else shipped_policy_file(model_name, kv_decode)
    if path is None:
        raise PolicyFileError(
            f"no calibrated PASK policy ships for model {model_name!r} with --kv-decode {kv_decode}: write one "
            f"with python -m sglang_pask.calibrate --kv-decode {CALIBRATED_DECODE.get(kv_decode, kv_decode)} "
            "and pass it with --pask-policy"
        )
    table = load_policy_file(path, num_layers, layer_ranges, model_name, kv_decode, kv_dropped)
    return get_policy("pask", table=table, **options)
