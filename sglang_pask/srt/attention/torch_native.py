"""SGLang's torch_native attention backend reading each layer group's own index lists.

Registered in place of ``TorchNativeAttnBackend`` (a class REPLACE hook). With a
:class:`~sglang_pask.srt.pool.LayerGroupMHAKVPool` behind the model runner, every layer reads, per
request, the positions of its layer group's view (:mod:`sglang_pask.kvpool.views`), translated to the
group's physical slots; positions the pool no longer holds (dropped before they reached the prefix
cache) are skipped. Under a low-bit ``--kv-dropped`` mode a request also reads its dropped tokens,
dequantized from their low-bit blocks (:mod:`sglang_pask.kvpool.lowbit`), placed before its read
list. The attention itself is SGLang's: the same gather, the same ``scaled_dot_product_attention``
call on the same shapes, so with nothing dropped the output is bitwise that of stock SGLang. When the
policy needs scores, the queries of the step score the keys they read
(:func:`sglang_pask.kernels.window_scores.sequence_window_scores`), and after a group's last layer
the view table compresses the group. Without a layer-group pool (e.g. a draft model) it is stock
SGLang.

Under StructKV (a :class:`~sglang_pask.structkv.forward_pass.StructKVPass` on the extend batch,
:mod:`sglang_pask.srt.model_loop`) the batch's rows are the pass's: each request's queries are the
rows it still computes, it writes KV only for them, and in a layer after its pruning began it reads
the cached prefix plus those rows (the other fresh tokens have no K/V there). Every layer's
last-window scores go to the pass, and after the model's last layer each group keeps, of the fresh
tokens, exactly what the pass chooses at R_KV
(:meth:`~sglang_pask.kvpool.compression.KVViewTable.keep_only`); decode compression stays the
policy's.

The bookkeeping (read lists, scores, compression) is :class:`~.reads.LayerGroupReads`, shared with the
triton backend (:mod:`.triton`). Not supported (refused with an error): sliding-window layers,
cross-attention, encoder-only models.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_pask.srt.attention.reads import LayerGroupReads, refuse_unsupported_layer
from sglang_pask.structkv.forward_pass import PASS_ATTRIBUTE, StructKVPass


class LayerGroupTorchNativeAttnBackend(LayerGroupReads, TorchNativeAttnBackend):
    """torch_native attention over per-layer-group views of each request's KV."""

    def __init__(self, model_runner: Any):
        super().__init__(model_runner)
        self._init_group_reads()

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        if self.grouped:
            self._begin_forward(forward_batch)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        prune = getattr(forward_batch, PASS_ATTRIBUTE, None)
        return self._forward(q, k, v, layer, save_kv_cache, forward_batch.out_cache_loc, is_extend=True, prune=prune)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
        return self._forward(q, k, v, layer, save_kv_cache, forward_batch.out_cache_loc, is_extend=False)

    def _forward(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer: Any,
        save_kv_cache: bool,
        out_cache_loc: torch.Tensor,
        is_extend: bool,
        prune: Optional[StructKVPass] = None,
    ) -> torch.Tensor:
        """Write the step's K/V, attend each request over its group's read list, score, compress.

        ``q``: ``(tokens, q_heads * head_dim)``; returns ``(tokens, q_heads * v_head_dim)``. With a
        StructKV pass, ``tokens`` are the pass's current rows.
        """
        refuse_unsupported_layer(layer)
        if prune is not None:
            out_cache_loc = prune.out_cache_loc
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(out_cache_loc, None), k, v)
        output = self._attend_gathered(q, layer, self._layer_group(layer), is_extend, prune)
        self._end_layer(layer, is_extend, prune)
        return output
