"""SGLang's triton attention backend reading each layer group's own index lists.

Registered in place of ``TritonAttnBackend`` (a class REPLACE hook). SGLang's triton kernels already
take the KV they read as index lists (``kv_indptr``, ``kv_indices``: per request, the slots of its
cached prefix in an extend, of its whole sequence in a decode); stock SGLang fills them from
``req_to_token``. Here, per forward and per layer group, they are the group's read lists
(:class:`~.reads.LayerGroupReads`): the positions the request's view of that group keeps, as the
group's physical slots, so a layer's kernel reads only what its group kept. Writes go through the
pool, which translates the virtual ``out_cache_loc`` to the group's slots. Everything else is
SGLang's own code and kernels (extend and decode, split-KV decode, lean decode), run on the group's
metadata. The policy's scores and the calibration probe's distortion come from the keys each request
read, gathered after the kernel (:meth:`~.reads.LayerGroupReads._observe`), as in the torch_native
backend (:mod:`.torch_native`). With nothing dropped (budget 1.0) the lists are stock SGLang's slots
in position order, so the kernels compute exactly what they compute in stock SGLang.

Under StructKV (a :class:`~sglang_pask.structkv.forward_pass.StructKVPass` on the extend batch,
:mod:`sglang_pask.srt.model_loop`) each layer runs SGLang's extend kernel on the pass's current rows:
``qo_indptr`` and ``max_extend_len`` count the rows each request computes now, ``out_cache_loc`` is
theirs (a layer writes K/V only for them), and ``kv_indices`` stays the cached prefix. So a layer
after a request's pruning began attends its cached prefix plus its skeleton rows, as on
torch_native. Every layer's last-window scores go to the pass, and after the model's last layer
each group keeps what the pass chooses at R_KV.

Not supported, refused with an error when the backend is built or at the first such forward:
CUDA graphs (the launcher turns them off: compression runs in Python between layers and the lists
change length every step), deterministic inference (its unified kernel
addresses the fresh tokens by their virtual ids), decode context parallelism, MLA, diffusion LLM
attention, speculative decoding, pages larger than one token, and sliding-window layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from sglang.srt.layers.attention.triton_backend import (
    ForwardMetadata,
    TritonAttnBackend,
)
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS
from sglang_pask.kernels.lowbit_decode_attention import lowbit_decode_attention_triton
from sglang_pask.srt.attention.reads import LayerGroupReads, refuse_unsupported_layer
from sglang_pask.srt.pool import LayerGroupMHAKVPool
from sglang_pask.structkv.forward_pass import PASS_ATTRIBUTE, StructKVPass


class LayerGroupTritonAttnBackend(LayerGroupReads, TritonAttnBackend):
    """triton attention over per-layer-group views of each request's KV."""

    def __init__(self, model_runner: Any, *args: Any, **kwargs: Any):
        super().__init__(model_runner, *args, **kwargs)
        self._init_group_reads()
        if self.grouped:
            _refuse_unsupported_backend(self)
        self._stock_metadata: Optional[ForwardMetadata] = None
        self._group_metadata: dict[int, ForwardMetadata] = {}
        self._pruned: dict[tuple[int, tuple[int, ...]], ForwardMetadata] = {}
        self._block_lists: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        if not self.grouped:
            return
        mode = forward_batch.forward_mode
        if not (mode.is_decode() or mode.is_context_parallel_extend()):  # decode, extend, mixed
            raise NotImplementedError(
                f"sglang-pask layer groups on the triton backend serve extend and decode batches only, not {mode}"
            )
        self._begin_forward(forward_batch)
        self._stock_metadata = self.forward_metadata
        self._group_metadata = {}
        self._pruned = {}
        self._block_lists = {}

    def _metadata_of_group(self, group: int, is_extend: bool) -> ForwardMetadata:
        """SGLang's metadata of this forward with ``kv_indptr`` ``(batch + 1,)`` int32 and
        ``kv_indices`` ``(total,)`` int64 replaced by the group's read lists (an extend reads only
        the cached prefix from the pool: the kernel takes the fresh tokens' K/V as they are computed)."""
        found = self._group_metadata.get(group)
        if found is not None:
            return found
        stock = self._stock_metadata
        assert stock is not None
        slots = []
        for (_, _, prefix_len, _), (positions, physical) in zip(self._batch, self._read_lists(group)):
            slots.append(physical[positions < prefix_len] if is_extend else physical)
        lengths = torch.tensor([s.numel() for s in slots], dtype=torch.int32, device=stock.kv_indptr.device)
        kv_indptr = torch.zeros(len(slots) + 1, dtype=torch.int32, device=lengths.device)
        kv_indptr[1:] = lengths.cumsum(0)
        kv_indices = torch.cat(slots).to(torch.int64) if slots else stock.kv_indices[:0]
        found = dataclasses.replace(stock, kv_indptr=kv_indptr, kv_indices=kv_indices)
        self._group_metadata[group] = found
        return found

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, True, kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, False, kwargs)

    def _forward(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool,
        is_extend: bool,
        kwargs: dict,
    ) -> torch.Tensor:
        """SGLang's kernel on the layer's group metadata, then scores and compression.

        ``q``: ``(tokens, q_heads * head_dim)``; returns ``(tokens, q_heads * v_head_dim)``.
        """
        refuse_unsupported_layer(layer)
        if k is None or v is None:
            raise NotImplementedError(
                "sglang-pask layer groups need the layer's fresh K/V in the attention call "
                f"(layer {layer.layer_id} passed none)"
            )
        group = self._layer_group(layer)
        prune: Optional[StructKVPass] = getattr(forward_batch, PASS_ATTRIBUTE, None) if is_extend else None
        if any(located is not None for located in self._lowbit_located(group)):
            output = self._attend_with_lowbit(q, k, v, layer, forward_batch, save_kv_cache, group, is_extend)
            self._end_layer(layer, is_extend, prune)
            return output
        metadata = self._metadata_of_group(group, is_extend)
        stock_loc = forward_batch.out_cache_loc
        if prune is not None:
            key = (group, tuple(prune.counts))  # the rows change only where a request prunes
            if key not in self._pruned:
                self._pruned[key] = self._pruned_metadata(metadata, prune)
            metadata = self._pruned[key]
            forward_batch.out_cache_loc = prune.out_cache_loc
        self.forward_metadata = metadata
        try:
            # super(): SGLang's class, even where the hook made its module name point at this one.
            run = super().forward_extend if is_extend else super().forward_decode
            output = run(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        finally:
            assert self._stock_metadata is not None
            self.forward_metadata = self._stock_metadata
            forward_batch.out_cache_loc = stock_loc
        score = self._scores_needed(prune, is_extend)
        observed = prune is not None or score or (is_extend and bool(self._distortion_probes))
        if observed:
            self._observe_layer(q, layer, group, is_extend, score, prune)
        self._end_layer(layer, is_extend, prune)
        return output

    def _attend_with_lowbit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool,
        group: int,
        is_extend: bool,
    ) -> torch.Tensor:
        """A step of a batch some of whose requests read low-bit tokens in ``group``: the step's K/V
        written, then a decode through the fused kernel over each request's full-precision slots and
        low-bit blocks (:meth:`_decode_fused`), or an extend over the read lists gathered with the
        low-bit tokens dequantized (:meth:`_attend_gathered`, as on torch_native).

        ``q``: ``(tokens, q_heads * head_dim)``; returns ``(tokens, q_heads * v_head_dim)``.
        """
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        if is_extend:
            return self._attend_gathered(q, layer, group, True, None)
        output = self._decode_fused(q, layer, group)
        if self._scores_needed(None, False):
            self._observe_layer(q, layer, group, False, True, None)
        return output

    def _decode_fused(self, q: torch.Tensor, layer: Any, group: int) -> torch.Tensor:
        """One decode step of ``layer`` by :func:`~sglang_pask.kernels.lowbit_decode_attention.lowbit_decode_attention_triton`:
        ``q`` ``(batch, q_heads * head_dim)`` -> ``(batch, q_heads * v_head_dim)``."""
        if layer.logit_cap is not None and layer.logit_cap > 0:
            raise NotImplementedError(
                f"sglang-pask's low-bit decode kernel has no logit capping (layer {layer.layer_id})"
            )
        assert self.lowbit is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        metadata = self._metadata_of_group(group, False)
        block_indptr, block_slots, block_masks = self._lowbit_block_lists(group)
        out = lowbit_decode_attention_triton(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            metadata.kv_indptr,
            metadata.kv_indices,
            block_indptr,
            block_slots,
            block_masks,
            self.lowbit.format.key_bits,
            self.lowbit.format.value_bits,
            layer.scaling,
        )
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _lowbit_block_lists(self, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's low-bit blocks in ``group`` as the fused kernel takes them: ``block_indptr``
        ``(batch + 1,)`` int32, ``block_slots`` ``(blocks, rows_per_block)`` int64 and ``block_masks``
        ``(blocks,)`` int64 (bit ``p``: the request reads place ``p`` of the block). Built once per
        forward and group."""
        found = self._block_lists.get(group)
        if found is not None:
            return found
        assert self.lowbit is not None
        rows = self.lowbit.rows_per_block
        device = self.req_to_token_pool.req_to_token.device
        slots, masks, counts = [], [], [0]
        for located in self._lowbit_located(group):
            if located is None:
                counts.append(counts[-1])
                continue
            blocks = located.slots.view(-1, rows)
            which, place = located.index // BLOCK_TOKENS, located.index % BLOCK_TOKENS
            bits = torch.ones_like(place) << place
            masks.append(torch.zeros(blocks.shape[0], dtype=torch.int64, device=device).index_add_(0, which, bits))
            slots.append(blocks)
            counts.append(counts[-1] + blocks.shape[0])
        found = (
            torch.tensor(counts, dtype=torch.int32, device=device),
            torch.cat(slots) if slots else torch.zeros((0, rows), dtype=torch.int64, device=device),
            torch.cat(masks) if masks else torch.zeros(0, dtype=torch.int64, device=device),
        )
        self._block_lists[group] = found
        return found

    @staticmethod
    def _pruned_metadata(metadata: ForwardMetadata, prune: StructKVPass) -> ForwardMetadata:
        """The group's extend metadata for the rows a StructKV pass computes now: ``qo_indptr``
        ``(batch + 1,)`` int32 and ``max_extend_len`` from the pass's per-request row counts. The
        kernel reads each request's cached prefix from the pool (``kv_indices``, unchanged) and its
        fresh rows' K/V as computed; those rows are in position order, so the kernel's causal mask
        over them is the mask over their original positions."""
        counts = prune.counts
        qo_indptr = torch.zeros(len(counts) + 1, dtype=torch.int32, device=metadata.qo_indptr.device)
        qo_indptr[1:] = torch.tensor(counts, dtype=torch.int32, device=qo_indptr.device).cumsum(0)
        return dataclasses.replace(metadata, qo_indptr=qo_indptr, max_extend_len=max(counts, default=0))

    def _observe_layer(
        self, q: torch.Tensor, layer: Any, group: int, is_extend: bool, score: bool, prune: Optional[StructKVPass]
    ) -> None:
        """Gather what each request read in this layer (its group's read list, the fresh tokens it
        computed included, all written by now) and feed it to the probe, the StructKV pass and the
        policy."""
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        k_cache = pool.get_key_buffer(layer.layer_id)
        v_cache = pool.get_value_buffer(layer.layer_id)
        queries = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim).movedim(0, 1)
        start = 0
        for index, (read, new) in enumerate(zip(self._read_lists(group), self._row_counts(prune))):
            positions, physical = self._readable(index, read, prune, layer.layer_id)
            query = queries[:, start : start + new, :]
            keys = k_cache[physical].movedim(0, 1).to(query.dtype)
            values = v_cache[physical].movedim(0, 1).to(query.dtype)
            self._observe(index, group, layer, query, keys, values, positions, is_extend, prune, score)
            start += new


def _refuse_unsupported_backend(backend: TritonAttnBackend) -> None:
    """Modes of SGLang's triton backend whose reads do not go through the per-request index lists."""
    unsupported = {
        "deterministic inference": backend.enable_deterministic,
        "decode context parallelism": backend.dcp_size > 1,
        "MLA": backend.use_mla,
        "diffusion LLM attention": backend.dllm_attention is not None,
        "sliding-window attention": backend.sliding_window_size is not None and backend.sliding_window_size > 0,
        f"page size {backend.page_size}": backend.page_size != 1,
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise NotImplementedError(
            f"sglang-pask layer groups on the triton attention backend do not support {', '.join(found)}"
        )
