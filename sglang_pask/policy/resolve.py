"""The configured policy instance: a registry name, plus the calibrated table for ``pask``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .base import KVPolicy
from .pask_file import PolicyFileError, load_policy_file
from .registry import get_policy

# Calibrated PASK policies shipped with the package, by model folder name.
CALIBRATED_DIR = Path(__file__).parent / "calibrated"


def shipped_policy_file(model_name: str) -> Optional[Path]:
    """The shipped PASK policy file for ``model_name``, if there is one."""
    path = CALIBRATED_DIR / f"{model_name}.json"
    return path if path.is_file() else None


def build_policy(name: str, pask_policy: Optional[str], num_layers: int, layer_ranges: Sequence[range],
                 model_name: str) -> KVPolicy:
    """The policy for ``--kv-policy name`` (and ``--pask-policy``) on the served model.

    Raises
    ------
    ValueError
        An unknown policy; for ``pask``, a missing or unfit policy file (:class:`PolicyFileError`).
    """
    if name != "pask":
        return get_policy(name)
    path = Path(pask_policy) if pask_policy is not None else shipped_policy_file(model_name)
    if path is None:
        raise PolicyFileError(
            f"no calibrated PASK policy ships for model {model_name!r}: write one with "
            f"python -m sglang_pask.calibrate and pass it with --pask-policy"
        )
    return get_policy("pask", table=load_policy_file(path, num_layers, layer_ranges, model_name))
