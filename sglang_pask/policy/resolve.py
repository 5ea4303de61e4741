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


def build_policy(
    name: str,
    pask_policy: Optional[str],
    num_layers: int,
    layer_ranges: Sequence[range],
    model_name: str,
    kv_decode: str = "compress",
    args: tuple[tuple[str, str], ...] = (),
) -> KVPolicy:
    """The policy for ``--kv-policy name`` (and ``--pask-policy``) on the served model, whose
    ``--kv-decode`` is ``kv_decode``, with the ``--kv-policy-args`` pairs ``args`` (typed by
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
    table = load_policy_file(path, num_layers, layer_ranges, model_name, kv_decode)
    return get_policy("pask", table=table, **options)
