"""One request's views of its KV: which sequence positions each layer group reads.

A request's *view* in layer group ``g`` (:class:`GroupView`) is a sorted list of sequence positions:
``kept`` (positions below ``upto`` that survived compression) followed by every position from
``upto`` on. Attention in the group's layers reads exactly these positions (filtered by what the
pool still holds). Only *private* positions are candidates for dropping: those at or after
:attr:`RequestView.shared_upto`, the length the request had when its last extend pass began
(everything before came from, or was published to, the radix prefix cache, which other requests may
share).

Only the data lives here: :mod:`.compression` decides what a view keeps, :mod:`.scores` folds the
attention scores a view carries, :mod:`.probe` acts on the views of calibration requests.

Pure torch (no sglang import).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from sglang_pask.kvpool.probe import CalibrationProbe

# A function that frees group ``g``'s slots of some positions of a request row: (row, group, positions).
DropFn = Callable[[int, int, Tensor], None]
# A function that replaces group ``g``'s K/V of some positions of a request row by their low-bit round
# trip in a ``--kv-dropped`` format, in place: (row, group, positions, format).
RequantizeFn = Callable[[int, int, Tensor, str], None]
# A function that gives the roles of some positions of a request row: (row, positions) -> roles.
RolesFn = Callable[[int, Tensor], Tensor]
# A function that says which positions of a request row group ``g`` holds at full precision:
# (row, group, positions) -> bool mask.
HoldsFn = Callable[[int, int, Tensor], Tensor]


@dataclass
class GroupView:
    """One request's view in one layer group.

    Attributes
    ----------
    kept : Tensor or None
        ``(k,)`` int64 sorted positions below :attr:`upto` still read; None means all of them.
    upto : int
        Every position from here on is read.
    scores : Tensor or None
        ``(m,)`` float32 running scores by position (``policy.accumulate_scores``).
    recent : deque[tuple[int, Tensor]]
        The latest steps' ``(num_queries, (len,) scores)``, covering the last ``window`` queries.
    pending : Tensor or None
        The current step's scores summed over the group's layers so far.
    pending_queries : int
        Queries in the current step.
    """

    kept: Optional[Tensor] = None
    upto: int = 0
    scores: Optional[Tensor] = None
    recent: deque = field(default_factory=deque)
    pending: Optional[Tensor] = None
    pending_queries: int = 0

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        """``(k + seq_len - upto,)`` int64: the positions attention reads, ascending."""
        tail = torch.arange(self.upto, seq_len, dtype=torch.int64, device=device)
        if self.kept is None:
            return torch.arange(0, seq_len, dtype=torch.int64, device=device)
        return torch.cat((self.kept, tail))


@dataclass
class RequestView:
    """A request's views in every layer group, and where its private tokens begin."""

    groups: list[GroupView]
    shared_upto: int
    seq_len: int = 0
    # The calibration probe of the request, if it carries one (:mod:`.probe`).
    probe: Optional[CalibrationProbe] = None
    # Per group: [sum of relative errors, layers measured] (probe.distortion_budget); empty without a probe.
    distortion: list[list[float]] = field(default_factory=list)
    # StructKV's report of the request's last pruned extend pass (StructKVPass.report), if any.
    prefill: Optional[dict] = None
