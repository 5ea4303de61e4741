"""``meta_info["kv_stats"]``: what the layer groups kept of each request, in its response.

Every finished request served by a layer-group pool carries ``{"full_tokens": n, "kept_tokens":
[k_0, ...], "budget": b, "group_budgets": [...], "policy": name}``: its final length, the positions
each layer group read at its last step, and the budgets. A request that asked with the sampling
parameter ``"return_kv_kept": true`` also gets ``"kept_positions"``: per group, those positions
themselves, ascending. Under a low-bit ``--kv-dropped`` mode, ``"kv_dropped"``, ``"lowbit_tokens"``
and ``"lowbit_slots"`` say what its low-bit blocks hold (with ``return_kv_kept`` also
``"lowbit_positions"`` and ``"lowbit_block_places"``). Under StructKV, ``"structkv"`` adds what its
prefill did (:meth:`~sglang_pask.structkv.forward_pass.StructKVPass.report`: pivot, skeleton, rows
per layer); a calibration request's distortion probe adds ``"distortion"``.

:func:`request_stats` builds the object when the request leaves the pool
(:mod:`sglang_pask.srt.rows`), which keeps it on the request (:data:`STATS_ATTRIBUTE`) until the
scheduler's output streamer (:mod:`sglang_pask.srt.output`) sends it, by the role fields' path:
SGLang's ``customized_info``.

Pure Python (no sglang import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

KV_STATS_KEY = "kv_stats"
# The scheduler-side request attribute that holds a finished request's kv_stats until its response.
STATS_ATTRIBUTE = "pask_kv_stats"


def request_stats(
    full_tokens: int,
    held: Sequence[Any],
    budget: float,
    group_budgets: list[float],
    policy: str,
    *,
    kept_positions: bool,
    kv_dropped: Optional[str] = None,
    lowbit: Optional[Sequence[Any]] = None,
    lowbit_slots: Optional[list[int]] = None,
    block_places: Optional[list[Any]] = None,
    structkv: Optional[dict] = None,
    distortion: Optional[list[float]] = None,
) -> dict[str, Any]:
    """The ``kv_stats`` object of a request that leaves the pool.

    Parameters
    ----------
    full_tokens : int
        The request's final length.
    held : Sequence[Tensor]
        ``(num_groups,)`` of ``(k_g,)`` int64 ascending: the positions each group read at the last step.
    budget, group_budgets, policy
        The server's ``--kv-budget``, its per-group budgets and ``--kv-policy``.
    kept_positions : bool
        Whether the request asked for the positions themselves (``return_kv_kept``).
    kv_dropped, lowbit, lowbit_slots, block_places
        Under a low-bit ``--kv-dropped`` mode (``lowbit`` not None): the mode, per group the ``(t_g,)``
        positions held in low-bit blocks, per group the slots those blocks take, and (with
        ``kept_positions``) where each block's tokens stand.
    structkv : dict, optional
        StructKV's report of the request's last pruned extend pass.
    distortion : list[float], optional
        A distortion probe's mean distortion per group.
    """
    stats: dict[str, Any] = {
        "full_tokens": full_tokens,
        "kept_tokens": [int(positions.numel()) for positions in held],
        "budget": budget,
        "group_budgets": group_budgets,
        "policy": policy,
    }
    if lowbit is not None:
        stats["kv_dropped"] = kv_dropped
        stats["lowbit_tokens"] = [int(positions.numel()) for positions in lowbit]
        stats["lowbit_slots"] = lowbit_slots
    if kept_positions:
        stats["kept_positions"] = [positions.tolist() for positions in held]
        if lowbit is not None:
            stats["lowbit_positions"] = [positions.tolist() for positions in lowbit]
            stats["lowbit_block_places"] = block_places
    if structkv is not None:
        stats["structkv"] = structkv
    if distortion is not None:
        stats["distortion"] = distortion
    return stats
