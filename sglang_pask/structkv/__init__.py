"""StructKV's core (pure torch, no sglang import): centrality, pivot detection, skeleton selection.

For one prompt of ``n`` tokens in a model of ``num_layers`` layers, the prefill drives it like this
(``S^(l)``: the layer's window scores summed over heads, ``(n,)`` float32):

1. ``acc = CentralityAccumulator(config.centrality_decay, first_layer)`` (``first_layer``: where the
   pivot search starts, :mod:`.prefill`); per layer ``l`` while the whole prompt runs:
   ``acc.add(S^(l))``, and when ``config.needs_statistics``, ``layer_statistics(S8^(l),
   config.topk_ratio)`` (stacked into ``(m, 3)``; ``S8``: the scores of only the newest
   ``config.statistics_window`` queries, 8 by default).
2. ``pivot = config.pivot_layer(num_layers, stats)`` (:class:`PivotConfig`).
3. ``skeleton = select_skeleton(acc.centrality(pivot), R_struct, window)``: the positions the layers
   after the pivot compute on (or, with ``config.restart_prefill``, every layer from 0). Online, a
   pivot settled after layer ``d > pivot`` reads ``acc.centrality(d)`` (:mod:`.prefill`).
4. Per layer, ``select_kv(S^(l), R_KV, window, positions, n)``: which of its tokens keep their KV.

:class:`.prefill.PromptPruning` drives steps 1-3 online, layer by layer, as SGLang's extend pass
runs (the pivot is settled while the layers run), and :func:`.prefill.kv_keep` is step 4 per layer
group.

Modules: :mod:`.centrality`, :mod:`.pivot`, :mod:`.skeleton`, :mod:`.segments` (the skeleton by
whole sentences and lines), :mod:`.prefill`; and :mod:`.forward_pass`, the state of one extend pass
over a batch of prompts that the server's model loop and attention backends share (not imported
here).
"""

from .centrality import CentralityAccumulator
from .pivot import (
    DEFAULT_STATISTICS_WINDOW,
    DEFAULT_WEIGHTS,
    PivotConfig,
    detect_pivot,
    layer_statistics,
    normalized_gradient,
    topk_count,
    transition_scores,
)
from .prefill import (
    DEFAULT_DOMINANCE,
    DEFAULT_PATIENCE,
    PromptPruning,
    PruneDecision,
    kv_keep,
    pooled_skeleton,
    settled_auto_pivot,
)
from .segments import segment_end_table, segment_ids, segment_kv_keep, segment_skeleton
from .skeleton import select_kv, select_skeleton, top_count

__all__ = [
    "DEFAULT_DOMINANCE",
    "DEFAULT_PATIENCE",
    "DEFAULT_STATISTICS_WINDOW",
    "DEFAULT_WEIGHTS",
    "CentralityAccumulator",
    "PivotConfig",
    "PromptPruning",
    "PruneDecision",
    "detect_pivot",
    "kv_keep",
    "pooled_skeleton",
    "segment_end_table",
    "segment_ids",
    "segment_kv_keep",
    "segment_skeleton",
    "layer_statistics",
    "normalized_gradient",
    "select_kv",
    "select_skeleton",
    "settled_auto_pivot",
    "top_count",
    "topk_count",
    "transition_scores",
]
