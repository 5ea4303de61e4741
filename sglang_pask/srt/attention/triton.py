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

CUDA-graph decode (SGLang's decode graph runner): SGLang sets up its graphs through
:meth:`~LayerGroupTritonAttnBackend.init_cuda_graph_state` and, before capture and before each replay,
:meth:`~LayerGroupTritonAttnBackend.init_forward_metadata_out_graph`, outside the graph. There the
backend copies each group's read lists (and low-bit blocks) of the step into buffers of fixed address
(:mod:`.graph_reads`); inside the graph each layer only runs its kernel on its group's buffers: the
fused low-bit kernel wherever the pool has a low-bit store, SGLang's decode kernel otherwise; where
the decode scores tokens (``--kv-decode compress`` with a scoring policy) it then adds the step
query's attention to each read slot into the group's score buffer
(:func:`~sglang_pask.kernels.window_scores.window_scores_triton` with a window of one query: no
host synchronization, its output sized by the buffer). What a group keeps is decided after the whole
step (:meth:`~LayerGroupTritonAttnBackend.finish_graph_step`, called by an AFTER hook of SGLang's
``ModelRunner.forward``), from those scores: no layer of a step reads another group's lists, so the
step computes what the eager path computes. Prefill (extend) batches always run eagerly. With
:data:`~.graph_reads.GRAPH_DECODE_ENV` set to 1, every decode batch reads from those buffers as a
replay does and runs eagerly: how the replay path is tested without a GPU.

Not supported, refused with an error when the backend is built or at the first such forward:
deterministic inference (its unified kernel addresses the fresh tokens by their virtual ids), decode
context parallelism, MLA, diffusion LLM attention, speculative decoding, pages larger than one token,
and sliding-window layers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import torch
from sglang.srt.layers.attention.triton_backend import (
    ForwardMetadata,
    TritonAttnBackend,
)
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS
from sglang_pask.kernels.lowbit_decode_attention import lowbit_decode_attention_triton
from sglang_pask.kernels.window_scores import window_scores_triton
from sglang_pask.srt.attention.graph_reads import GRAPH_DECODE_ENV, BlockLists, GraphReadBuffers
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
        self._block_lists: dict[int, BlockLists] = {}
        # CUDA-graph decode: the groups' buffers, and while a step reads from them, each group's
        # metadata and block lists over them; whether that step's groups still wait for finishing.
        self._graph_buffers: Optional[GraphReadBuffers] = None
        self._graph_metadata: Optional[dict[int, ForwardMetadata]] = None
        self._graph_blocks: dict[int, BlockLists] = {}
        self._graph_step_pending = False

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        if not self.grouped:
            return
        mode = forward_batch.forward_mode
        if not (mode.is_decode() or mode.is_context_parallel_extend()):  # decode, extend, mixed
            raise NotImplementedError(
                f"sglang-pask layer groups on the triton backend serve extend and decode batches only, not {mode}"
            )
        self._refuse_unfinished_graph_step()
        self._graph_metadata = None
        if mode.is_decode() and os.environ.get(GRAPH_DECODE_ENV) == "1":
            if self._graph_buffers is None:
                self._graph_buffers = self._allocate_graph_buffers(self.req_to_token_pool.size)
            self._enter_graph_step(forward_batch, False)
            return
        self._begin_forward(forward_batch)
        self._stock_metadata = self.forward_metadata
        self._group_metadata = {}
        self._pruned = {}
        self._block_lists = {}

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any) -> None:
        """SGLang's graph buffers, and the layer groups' read-list buffers for ``max_bs`` requests."""
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.grouped:
            self._graph_buffers = self._allocate_graph_buffers(max_bs)

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        """SGLang's graph metadata, then the groups' lists of the step in the graph buffers (at
        capture: padding only, the captured kernels read the buffers' addresses)."""
        if self.grouped:
            self._refuse_unfinished_graph_step()
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        if self.grouped:
            self._enter_graph_step(forward_batch, in_capture)

    def _allocate_graph_buffers(self, max_bs: int) -> GraphReadBuffers:
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        assert self.views is not None
        return GraphReadBuffers.allocate(
            len(pool.layout.ranges),
            max_bs,
            self.max_context_len,
            self.lowbit.rows_per_block if self.lowbit is not None else None,
            BLOCK_TOKENS,
            self.req_to_token_pool.req_to_token.device,
            scores=self.views.scores_needed(False),
        )

    def _enter_graph_step(self, forward_batch: Any, in_capture: bool) -> None:
        """Point every group's decode metadata at the graph buffers and fill them with the step's
        lists (the first ``batch_size - num_padding`` rows are requests, the rest padding)."""
        mode = forward_batch.forward_mode
        if not mode.is_decode():
            raise NotImplementedError(f"sglang-pask layer groups run only decode batches in a CUDA graph, not {mode}")
        assert self.views is not None
        buffers = self._graph_buffers
        if buffers is None:
            raise RuntimeError("sglang-pask: a CUDA-graph decode step before SGLang set up its graph buffers")
        rows = forward_batch.batch_size
        requests = 0 if in_capture else rows - int(getattr(forward_batch, "num_padding", 0) or 0)
        self._begin_forward(forward_batch, requests)
        self._block_lists = {}
        self._stock_metadata = stock = self.forward_metadata
        metadata, blocks = {}, {}
        for group in range(len(self.views.group_budgets)):
            kv_indptr, kv_indices = self._group_lists(group, False, stock.kv_indptr.device)
            located = self._lowbit_block_lists(group) if buffers.block_indptr is not None else None
            buffers.fill(group, kv_indptr, kv_indices, rows - requests, located)
            kv_indptr, kv_indices = buffers.lists(group, rows)
            metadata[group] = dataclasses.replace(stock, kv_indptr=kv_indptr, kv_indices=kv_indices)
            if buffers.block_indptr is not None:
                blocks[group] = buffers.blocks(group, rows)
        self._graph_metadata, self._graph_blocks = metadata, blocks
        self._graph_step_pending = requests > 0

    def _refuse_unfinished_graph_step(self) -> None:
        if self._graph_step_pending:
            raise RuntimeError(
                "sglang-pask: the previous CUDA-graph decode step was never finished (its groups did not "
                "compress or pack); the AFTER hook of ModelRunner.forward did not run"
            )

    def finish_graph_step(self) -> None:
        """After a decode step that read the graph buffers (replayed or run eagerly): every group, in
        order, takes the step's scores from its buffer (where the decode scores) and keeps, compresses
        or packs what its policy decides, then the step closes; nothing otherwise."""
        if not self._graph_step_pending:
            return
        self._graph_step_pending = False
        assert self.views is not None and self._graph_buffers is not None
        step_scores = self._graph_buffers.scores
        for group in range(len(self.views.group_budgets)):
            if step_scores is not None:
                start = 0
                for (row, _, _, _), (positions, _) in zip(self._batch, self._read_lists(group)):
                    read = positions.numel()
                    scores = step_scores[group, start : start + read]
                    self.views.add_scores(row, group, positions, scores, self.views.score_queries(1))
                    start += read
            self._finish_group(group, False)

    def _group_lists(self, group: int, is_extend: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's read lists of this forward as SGLang's kernels take them: ``kv_indptr``
        ``(batch + 1,)`` int32 and ``kv_indices`` ``(total,)`` int64 (an extend reads only the cached
        prefix from the pool: the kernel takes the fresh tokens' K/V as they are computed)."""
        slots = []
        for (_, _, prefix_len, _), (positions, physical) in zip(self._batch, self._read_lists(group)):
            slots.append(physical[positions < prefix_len] if is_extend else physical)
        lengths = torch.tensor([s.numel() for s in slots], dtype=torch.int32, device=device)
        kv_indptr = torch.zeros(len(slots) + 1, dtype=torch.int32, device=device)
        kv_indptr[1:] = lengths.cumsum(0)
        kv_indices = torch.cat(slots).to(torch.int64) if slots else torch.zeros(0, dtype=torch.int64, device=device)
        return kv_indptr, kv_indices

    def _metadata_of_group(self, group: int, is_extend: bool) -> ForwardMetadata:
        """SGLang's metadata of this forward with ``kv_indptr`` and ``kv_indices`` replaced by the
        group's read lists (:meth:`_group_lists`), built once per forward and group."""
        found = self._group_metadata.get(group)
        if found is not None:
            return found
        stock = self._stock_metadata
        assert stock is not None
        kv_indptr, kv_indices = self._group_lists(group, is_extend, stock.kv_indptr.device)
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
        if self._graph_metadata is not None:
            return self._decode_from_graph_buffers(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, False, kwargs)

    def _decode_from_graph_buffers(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer: Any,
        forward_batch: Any,
        save_kv_cache: bool,
        kwargs: dict,
    ) -> torch.Tensor:
        """A decode layer as a CUDA graph captures it: the kernel on the group's graph buffers, no
        host synchronization, no step-dependent branch; the group's finishing waits for
        :meth:`finish_graph_step`.

        ``q``: ``(batch, q_heads * head_dim)``; returns ``(batch, q_heads * v_head_dim)``.
        """
        _refuse_layer(layer, k, v)
        assert self._graph_metadata is not None and self._stock_metadata is not None
        group = self._layer_group(layer)
        metadata = self._graph_metadata[group]
        if self.lowbit is not None:
            if save_kv_cache:
                self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
            output = self._decode_fused(q, layer, metadata, self._graph_blocks[group])
        else:
            self.forward_metadata = metadata
            try:
                output = super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            finally:
                self.forward_metadata = self._stock_metadata
        assert self._graph_buffers is not None
        step_scores = self._graph_buffers.scores
        if step_scores is not None:  # the step's K/V is written: the query attends its own key too
            pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
            queries = q.reshape(-1, 1, layer.tp_q_head_num, layer.qk_head_dim)
            keys = pool.get_key_buffer(layer.layer_id)
            scores = window_scores_triton(queries, keys, metadata.kv_indptr, metadata.kv_indices, layer.scaling)
            step_scores[group].add_(scores.sum(dim=0))
        return output

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
        _refuse_layer(layer, k, v)
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
        output = self._decode_fused(q, layer, self._metadata_of_group(group, False), self._lowbit_block_lists(group))
        if self._scores_needed(None, False):
            self._observe_layer(q, layer, group, False, True, None)
        return output

    def _decode_fused(self, q: torch.Tensor, layer: Any, metadata: ForwardMetadata, blocks: BlockLists) -> torch.Tensor:
        """One decode step of ``layer`` by :func:`~sglang_pask.kernels.lowbit_decode_attention.lowbit_decode_attention_triton`
        over the full-precision lists of ``metadata`` and the low-bit ``blocks`` of the layer's group:
        ``q`` ``(batch, q_heads * head_dim)`` -> ``(batch, q_heads * v_head_dim)``."""
        if layer.logit_cap is not None and layer.logit_cap > 0:
            raise NotImplementedError(
                f"sglang-pask's low-bit decode kernel has no logit capping (layer {layer.layer_id})"
            )
        assert self.lowbit is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        block_indptr, block_slots, block_masks = blocks
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

    def _lowbit_block_lists(self, group: int) -> BlockLists:
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


def _refuse_layer(layer: Any, k: Optional[torch.Tensor], v: Optional[torch.Tensor]) -> None:
    """Layers the group reads cannot serve: not causal full attention, or no fresh K/V passed in."""
    refuse_unsupported_layer(layer)
    if k is None or v is None:
        raise NotImplementedError(
            "sglang-pask layer groups need the layer's fresh K/V in the attention call "
            f"(layer {layer.layer_id} passed none)"
        )


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
