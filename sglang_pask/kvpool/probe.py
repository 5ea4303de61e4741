"""Calibration probes on the views: what a probe request asks, and what it does to its views.

``python -m sglang_pask.calibrate`` sends requests that carry a :class:`CalibrationProbe` (parsed from
the request by :mod:`sglang_pask.api.probe`). A probe either drops one role's private tokens in one
layer group (or all of them), keeping everything else (:func:`finish_group`), or measures, per layer
group, the attention-output distortion of keeping a budget's score-ordered subset of the prompt
(:func:`record_distortion`, reported by :func:`distortion_report`).

This is research machinery, not serving: the view table (:mod:`.compression`) and the attention
backends call it only for the rows in :attr:`~.compression.KVViewTable.probes`, which is empty
unless a calibration request is running.

Pure torch (no sglang import).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from sglang_pask.policy.distortion import attention_distortion

if TYPE_CHECKING:
    from sglang_pask.kvpool.compression import KVViewTable
    from sglang_pask.kvpool.views import RequestView

# CalibrationProbe.drop_group of a probe that drops its role in every layer group.
ALL_GROUPS = -1
# CalibrationProbe.drop_role of a low-bit probe that stores every private token at low bits.
ALL_ROLES = -2


@dataclass(frozen=True)
class CalibrationProbe:
    """What a calibration request asks of the views (``python -m sglang_pask.calibrate``).

    Attributes
    ----------
    drop_group, drop_role : int or None
        Drop every private token of this role in this layer group (every group if ``drop_group``
        is :data:`ALL_GROUPS`), keep everything else. ``drop_role`` :data:`ALL_ROLES` (with ``lowbit``
        only) takes every private token.
    lowbit : str or None
        With ``drop_group``: instead of dropping them, keep those tokens as their low-bit round trip in
        this ``--kv-dropped`` format (``2bit`` or ``k4v2``), in place: what a low-bit tier would read.
    distortion_budget : float or None
        Measure, per layer group, the attention-output distortion of keeping this budget's
        score-ordered subset of the prompt (the prompt's last ``score_window`` queries; nothing is
        dropped).
    """

    drop_group: Optional[int] = None
    drop_role: Optional[int] = None
    distortion_budget: Optional[float] = None
    lowbit: Optional[str] = None


# A function that gives a row's calibration probe, if its request carries one.
ProbeFn = Callable[[int], Optional[CalibrationProbe]]


def finish_group(
    table: "KVViewTable", row: int, group: int, seq_len: int, is_extend: bool, probe: CalibrationProbe
) -> None:
    """A drop probe's group finished a step: drop the probe's role there, as the server would
    compress (under ``--kv-decode keep``, decode drops no generated token)."""
    if probe.drop_group in (group, ALL_GROUPS) and (is_extend or table.compress_decode):
        if probe.lowbit is None:
            drop_role(table, row, group, seq_len, probe.drop_role)
        else:
            requantize_role(table, row, group, seq_len, probe.drop_role, probe.lowbit)


def _role_positions(
    table: "KVViewTable", row: int, group: int, seq_len: int, role: Optional[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """The row's positions ``group`` reads ``(k,)``, its private ones ``(p,)``, and which of those are
    of ``role`` ``(p,)`` bool (all of them for :data:`ALL_ROLES`)."""
    request = table.views[row]
    held = request.groups[group].positions(seq_len, table.device)
    private = held[held >= request.shared_upto]
    if role == ALL_ROLES:
        return held, private, torch.ones_like(private, dtype=torch.bool)
    roles = table.roles_of(row, private) if table.roles_of is not None else torch.full_like(private, -1)
    return held, private, roles == role


def drop_role(table: "KVViewTable", row: int, group: int, seq_len: int, role: Optional[int]) -> None:
    """Drop the row's private tokens of ``role`` from ``group``."""
    request = table.views[row]
    view = request.groups[group]
    held, private, of_role = _role_positions(table, row, group, seq_len, role)
    if bool(of_role.any()):
        table.drop(row, group, private[of_role])
    view.kept = torch.cat((held[held < request.shared_upto], private[~of_role]))
    view.upto = seq_len


def requantize_role(table: "KVViewTable", row: int, group: int, seq_len: int, role: Optional[int], lowbit: str) -> None:
    """Replace the K/V of the row's private tokens of ``role`` not yet requantized in ``group`` by their
    low-bit round trip in format ``lowbit`` (nothing leaves the view).

    Raises
    ------
    RuntimeError
        If the view table has no requantize function (a pool without layer groups).
    """
    if table.requantize is None:
        raise RuntimeError("a low-bit calibration probe needs the layer-group pool's requantize function")
    request = table.views[row]
    view = request.groups[group]
    _, private, of_role = _role_positions(table, row, group, seq_len, role)
    fresh = private[of_role & (private >= view.upto)]
    if fresh.numel():
        table.requantize(row, group, fresh, lowbit)
    view.upto = seq_len


def record_distortion(
    table: "KVViewTable",
    row: int,
    group: int,
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    scaling: float,
    probe: CalibrationProbe,
) -> None:
    """Record one layer's attention-output distortion for the row's distortion probe.

    Parameters
    ----------
    query : Tensor
        ``(q_heads, new, head_dim)``: the request's queries of the step; the last ``score_window``
        of them are measured.
    keys, values : Tensor
        ``(kv_heads, k, head_dim)``: what the request read in the layer.
    scaling : float
        The layer's attention scale.
    """
    new = query.shape[1]
    window_q = query[:, max(0, new - table.score_window) :, :].movedim(0, 1)
    relative_error = attention_distortion(
        window_q, keys.movedim(0, 1), values.movedim(0, 1), scaling, probe.distortion_budget, table.window
    )
    totals = table.views[row].distortion[group]
    totals[0] += relative_error
    totals[1] += 1


def distortion_report(request: "RequestView") -> Optional[list[float]]:
    """``(num_groups,)`` mean distortion per layer of each group, if the request carries a distortion
    probe; else None."""
    if request.probe is None or request.probe.distortion_budget is None:
        return None
    return [total / max(count, 1) for total, count in request.distortion]
