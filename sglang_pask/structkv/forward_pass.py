"""StructKV inside one SGLang extend pass: the per-forward state the model loop and attention share.

:mod:`sglang_pask.srt.model_loop` creates a :class:`StructKVPass` for an eligible extend batch and attaches it to
the ``ForwardBatch`` (attribute :data:`PASS_ATTRIBUTE`); the layer-group attention backend
(:mod:`sglang_pask.srt.attention.reads`) reads it in every layer. It holds, for the batch's packed rows:

- ``rows`` ``(K,)`` int64: the packed rows of the full batch (``T`` rows) the layers compute now, with
  their ``positions`` and ``out_cache_loc`` (the KV slots these rows write); all ``T`` at first;
- per request (:class:`RequestPrune`): its :class:`~sglang_pask.structkv.PromptPruning` (centrality,
  statistics, the pruning decision), the local indices it computes now, and per layer group the
  window scores summed over the group's layers, for the KV it keeps.

The attention backend reports each layer's window scores (:meth:`StructKVPass.add_scores`), reads
which positions a request's layer may attend (:meth:`StructKVPass.computed`) and, after the model's
last layer, asks which prompt tokens every layer group keeps (:meth:`StructKVPass.kv_keep`).

Pure torch (no sglang import: the model loop hands SGLang's tensors in); no model code here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from sglang_pask.config import STRUCTKV_KV_SCORES, STRUCTKV_SELECTIONS
from sglang_pask.structkv import PivotConfig, PromptPruning, PruneDecision, kv_keep, segment_ids, segment_kv_keep

PASS_ATTRIBUTE = "pask_structkv"


@dataclass(frozen=True)
class StructKVSettings:
    """What the server's flags fix for every pass.

    Attributes
    ----------
    pivot : PivotConfig
        Pivot mode, decay, weights.
    prefill_ratio : float
        ``R_struct``.
    kv_ratio : float
        ``R_KV``.
    window : int
        The recent window every layer group's KV keeps (``--kv-window``).
    score_window : int
        The observation window (``--structkv-window``): the last queries that score the prompt,
        which the skeleton always holds.
    segments : bool
        The skeleton and the KV keep sets by whole segments (``--structkv-select segments``) rather
        than by pooled tokens.
    kv_centrality : bool
        Every group's KV keep set ranked by the decision's centrality (``--structkv-kv-score
        centrality``) rather than by the group's own window scores.
    min_prompt : int
        ``--structkv-min-prompt``: a request whose prompt (cached prefix plus the tokens this pass
        computes) is shorter is served unpruned, its KV left to the ``--kv-policy``.
    """

    pivot: PivotConfig
    prefill_ratio: float
    kv_ratio: float
    window: int
    score_window: int
    segments: bool
    kv_centrality: bool
    min_prompt: int = 0

    @classmethod
    def from_flags(
        cls,
        mode: str,
        pivot: str | int,
        prefill_ratio: float,
        kv_ratio: float,
        window: int,
        score_window: int,
        skeleton: str,
        kv_score: str,
        min_prompt: int = 0,
    ) -> "StructKVSettings":
        """``structkv``: decayed centrality (lambda 0.9); ``fixed-pivot``: FastKV-style, the pivot
        layer's own scores (lambda 0); ``gemfilter``: layer N's scores and a restart from layer 0.
        ``skeleton`` is ``segments`` or ``tokens``; ``kv_score`` is ``own`` or ``centrality``;
        ``min_prompt`` the shortest prompt pruned."""
        if mode == "structkv":
            config = PivotConfig(pivot=pivot)
        elif mode == "fixed-pivot":
            config = PivotConfig(pivot=pivot, decay=0.0)
        elif mode == "gemfilter":
            config = PivotConfig(pivot=pivot, gemfilter=True)
        else:
            raise ValueError(f"unknown StructKV mode {mode!r}")
        if skeleton not in STRUCTKV_SELECTIONS:
            raise ValueError(f"unknown StructKV skeleton {skeleton!r}")
        if kv_score not in STRUCTKV_KV_SCORES:
            raise ValueError(f"unknown StructKV KV score {kv_score!r}")
        return cls(
            config,
            prefill_ratio,
            kv_ratio,
            window,
            score_window,
            skeleton == "segments",
            kv_score == "centrality",
            min_prompt,
        )

    def prunes(self, prompt_tokens: int) -> bool:
        """Whether a prompt of ``prompt_tokens`` tokens is pruned (:attr:`min_prompt`)."""
        return prompt_tokens >= self.min_prompt


@dataclass
class RequestPrune:
    """One request of the batch.

    Attributes
    ----------
    row : int
        Its request-pool row.
    prefix_len : int
        Tokens matched from the prefix cache (not computed, never pruned).
    length : int
        ``n``: tokens this pass computes (positions ``prefix_len .. prefix_len + n - 1``).
    pruning : PromptPruning or None
        Its centrality, statistics and decision; None when it is served unpruned (a prompt shorter
        than ``--structkv-min-prompt``): it computes every layer on all its tokens and its KV is
        left to the ``--kv-policy``.
    computed : Tensor
        ``(c,)`` int64 local indices the layers compute now, sorted (all ``n`` at first).
    group_scores : dict[int, Tensor]
        Per layer group, ``(n,)`` float32 window scores summed over the group's layers that ran in
        the current epoch.
    """

    row: int
    prefix_len: int
    length: int
    pruning: Optional[PromptPruning]
    computed: Tensor
    group_scores: dict[int, Tensor] = field(default_factory=dict)

    @property
    def decision(self) -> Optional[PruneDecision]:
        return None if self.pruning is None else self.pruning.decision

    def computes_all(self, layer: int) -> bool:
        """Whether ``layer`` computes (and writes KV for) all ``n`` tokens of the request."""
        decision = self.decision
        return decision is None or layer < decision.prunes_from


class StructKVPass:
    """The StructKV state of one extend forward (see the module docstring).

    Parameters
    ----------
    settings : StructKVSettings
        From the flags.
    num_layers : int
        The model's layers.
    layer_groups : list[int]
        ``(num_layers,)``: each layer's group.
    rows, prefix_lens, extend_lens : list[int]
        Per request in batch order: request-pool row, cached prefix, tokens computed.
    positions, out_cache_loc : Tensor
        ``(T,)``: the batch's positions and KV write slots.
    segment_ends : Tensor, optional
        ``(T,)`` bool: which of the batch's tokens end a segment
        (:func:`sglang_pask.structkv.segment_end_table` of their ids); required with
        ``settings.segments``.
    unpruned : list[bool], optional
        Per request: True if it must compute every layer on all its tokens whatever its length (it
        asked for the logprobs of its prompt tokens); such a request runs as one shorter than
        ``--structkv-min-prompt`` does.
    """

    def __init__(
        self,
        settings: StructKVSettings,
        num_layers: int,
        layer_groups: list[int],
        rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        positions: Tensor,
        out_cache_loc: Tensor,
        segment_ends: Optional[Tensor] = None,
        unpruned: Optional[list[bool]] = None,
    ) -> None:
        if settings.segments and segment_ends is None:
            raise ValueError("a segment skeleton needs the batch's segment ends")
        self.settings = settings
        self.num_layers = num_layers
        self.layer_groups = layer_groups
        device = positions.device
        starts = [0]
        for n in extend_lens:
            starts.append(starts[-1] + n)
        self.requests = [
            RequestPrune(
                row,
                prefix,
                n,
                PromptPruning(
                    settings.pivot,
                    num_layers,
                    n,
                    settings.prefill_ratio,
                    settings.score_window,
                    segments=None if not settings.segments else segment_ids(segment_ends[start : start + n]),
                )
                if settings.prunes(prefix + n) and not whole
                else None,
                torch.arange(n, device=device),
            )
            for row, prefix, n, start, whole in zip(
                rows, prefix_lens, extend_lens, starts, unpruned or [False] * len(rows)
            )
        ]
        self.rows = torch.arange(positions.numel(), device=device)
        self.positions = positions
        self.out_cache_loc = out_cache_loc
        self.epoch = 0
        # Rows each layer computed (summed over the batch), for tests and the server log.
        self.rows_per_layer: list[int] = []

    @property
    def counts(self) -> list[int]:
        """Rows each request computes now."""
        return [request.computed.numel() for request in self.requests]

    def indptr(self) -> Tensor:
        """``(B + 1,)`` int64 offsets of the requests' current rows."""
        counts = torch.tensor([0, *self.counts], dtype=torch.int64)
        return counts.cumsum(0).to(self.rows.device)

    @property
    def restarts(self) -> bool:
        """GemFilter mode: layers up to the pivot run twice, so their first run's scores do not
        feed a decode policy."""
        return self.settings.pivot.restart_prefill

    def feeds_policy_scores(self) -> bool:
        """Whether this epoch's scores are the final ones for the view table's policy."""
        return not self.restarts or self.epoch > 0

    def prunes(self, index: int) -> bool:
        """Whether request ``index`` is pruned (else it runs unpruned, :class:`RequestPrune`)."""
        return self.requests[index].pruning is not None

    def computed(self, index: int, layer: int) -> Optional[Tensor]:
        """``(c,)`` int64 absolute positions of the fresh tokens request ``index`` has K/V for in
        ``layer`` this epoch, or None when it has all of them."""
        request = self.requests[index]
        if request.computes_all(layer):
            return None
        return request.computed + request.prefix_len

    def statistics_queries(self, index: int, scored: int) -> Optional[int]:
        """How many of the newest queries request ``index``'s pivot statistics read when ``scored``
        queries score the prompt: None when they read those scores themselves (a fixed pivot, a
        decision already taken, or a window no longer than the statistics')."""
        pivot = self.settings.pivot
        if (
            not pivot.needs_statistics
            or not self.prunes(index)
            or self.requests[index].decision is not None
            or scored <= pivot.statistics_window
        ):
            return None
        return pivot.statistics_window

    def add_scores(
        self, index: int, layer: int, positions: Tensor, scores: Tensor, statistics_scores: Optional[Tensor] = None
    ) -> None:
        """One layer's window scores of request ``index`` (a pruned one: :meth:`prunes`).

        Parameters
        ----------
        positions : Tensor
            ``(k,)`` int64 absolute positions the layer read (cached prefix and fresh tokens).
        scores : Tensor
            ``(k,)`` float: attention the last-window queries paid to them, summed over heads.
        statistics_scores : Tensor, optional
            ``(k,)`` float: the same from the newest :meth:`statistics_queries` queries, when that
            is not None.
        """
        request = self.requests[index]
        if request.pruning is None:
            raise ValueError(f"request {index} is served unpruned: it has no StructKV scores")
        fresh = positions >= request.prefix_len
        dense = self._dense(request, positions, fresh, scores)
        group = self.layer_groups[layer]
        found = request.group_scores.get(group)
        request.group_scores[group] = dense if found is None else found + dense
        if request.computes_all(layer) and request.decision is None:
            statistics = (
                None if statistics_scores is None else self._dense(request, positions, fresh, statistics_scores)
            )
            request.pruning.observe(layer, dense, statistics)

    @staticmethod
    def _dense(request: RequestPrune, positions: Tensor, fresh: Tensor, scores: Tensor) -> Tensor:
        """``(n,)`` float32: ``scores`` ``(k,)`` of the fresh ones among ``positions`` at their local
        places."""
        dense = torch.zeros(request.length, dtype=torch.float32, device=scores.device)
        dense[positions[fresh] - request.prefix_len] = scores[fresh].float()
        return dense

    def after_layer(self, layer: int) -> list[int]:
        """The requests whose decision was taken at ``layer`` (they shrink from the next layer on)."""
        self.rows_per_layer.append(self.rows.numel())
        return [
            i
            for i, request in enumerate(self.requests)
            if request.decision is not None
            and request.decision.decided_at == layer
            and request.computed.numel() == request.length
        ]

    def select(self, keep_local: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Keep, per request, ``keep_local[b]`` (indices into its *current* rows).

        Returns
        -------
        tuple[Tensor, Tensor]
            ``keep_indices`` ``(K',)`` int64 and ``keep_indptr`` ``(B + 1,)`` int64: the CSR selection
            over the current packed rows (:mod:`sglang_pask.kernels.skeleton_gather`).
        """
        sizes = torch.tensor([0, *(k.numel() for k in keep_local)], dtype=torch.int64)
        return torch.cat(keep_local), sizes.cumsum(0).to(self.rows.device)

    def apply(self, index_rows: Tensor, keep_local: list[Tensor], restart: bool) -> None:
        """The packed selection was gathered: ``index_rows`` ``(K',)`` are the kept rows among the
        current ones; each request now computes ``computed[keep_local[b]]``."""
        self.rows = self.rows[index_rows]
        self.positions = self.positions[index_rows]
        self.out_cache_loc = self.out_cache_loc[index_rows]
        for request, keep in zip(self.requests, keep_local):
            request.computed = request.computed[keep]
        if restart:
            self.epoch += 1
            for request in self.requests:
                request.group_scores = {}

    def report(self, index: int) -> Optional[dict]:
        """What request ``index``'s prefill did: mode, pivot, the layer after which it shrank (or
        restarted), tokens computed, skeleton size, the rows each layer computed in the final
        epoch, the selection (``segments`` or ``tokens``) and, by segments, how many segments the
        computed part has; None for a request served unpruned."""
        request = self.requests[index]
        if request.pruning is None:
            return None
        decision = request.decision
        segments = request.pruning.segments
        rows = [
            request.length if request.computes_all(layer) else request.computed.numel()
            for layer in range(self.num_layers)
        ]
        return {
            "mode": "gemfilter" if self.restarts else ("auto" if self.settings.pivot.needs_statistics else "fixed"),
            "pivot": None if decision is None else decision.pivot,
            "decided_at": None if decision is None else decision.decided_at,
            "restarted": self.epoch > 0,
            "computed_tokens": request.length,
            "skeleton_tokens": request.computed.numel(),
            "rows_per_layer": rows,
            "select": "tokens" if segments is None else "segments",
            "segments": None if segments is None else (int(segments.max()) + 1 if segments.numel() else 0),
        }

    def kv_keep(self, index: int, group: int, group_layers: range) -> Tensor:
        """``(k,)`` int64 absolute positions of the fresh tokens whose KV ``group`` keeps.

        Candidates are the tokens every layer of the group computed in the final epoch: all ``n``
        if the group ends before pruning began, else the skeleton. They are ranked by the group's
        own window scores, or with ``settings.kv_centrality`` by the decision's centrality (the
        group's own scores when no decision was taken). Only for a pruned request (:meth:`prunes`).
        """
        request = self.requests[index]
        if request.pruning is None:
            raise ValueError(f"request {index} is served unpruned: its KV is the --kv-policy's")
        device = request.computed.device
        if request.computes_all(group_layers[-1]):
            candidates = torch.arange(request.length, device=device)
        else:
            candidates = request.computed
        scores = request.group_scores.get(group)
        if self.settings.kv_centrality and request.decision is not None:
            scores = request.decision.centrality
        if scores is None:
            scores = torch.zeros(request.length, dtype=torch.float32, device=device)
        segments = request.pruning.segments
        if segments is not None:
            keep = segment_kv_keep(scores, candidates, segments, self.settings.kv_ratio, self.settings.window)
        else:
            keep = kv_keep(scores, candidates, self.settings.kv_ratio, self.settings.window)
        return keep + request.prefix_len
