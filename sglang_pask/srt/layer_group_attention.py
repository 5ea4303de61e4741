"""SGLang's torch_native attention backend reading each layer group's own index lists.

Registered in place of ``TorchNativeAttnBackend`` (a class REPLACE hook). With a
:class:`~.layer_group_pool.LayerGroupMHAKVPool` behind the model runner, every layer reads, per
request, the positions of its layer group's view (:mod:`.kv_views`), translated to the group's
physical slots; positions the pool no longer holds (dropped before they reached the prefix cache)
are skipped. The attention itself is SGLang's: the same gather, the same
``scaled_dot_product_attention`` call on the same shapes, so with nothing dropped the output is
bitwise that of stock SGLang. When the policy needs scores, the queries of the step score the keys
they read (:func:`kernels.window_scores.sequence_window_scores`), and after a group's last layer the
view table compresses the group. Without a layer-group pool (e.g. a draft model) it is stock SGLang.

Under StructKV (a :class:`~.structkv_pass.StructKVPass` on the extend batch, :mod:`.structkv_model`)
the batch's rows are the pass's: each request's queries are the rows it still computes, it writes KV
only for them, and in a layer after its pruning began it reads the cached prefix plus those rows (the
other fresh tokens have no K/V there). Every layer's last-window scores go to the pass, and after the
model's last layer each group keeps, of the fresh tokens, exactly what the pass chooses at R_KV
(:meth:`~.kv_views.KVViewTable.keep_only`); decode compression stays the policy's.

Not supported (refused with an error): sliding-window layers, cross-attention, encoder-only models.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from torch.nn.functional import scaled_dot_product_attention

from sglang_pask.kernels.window_scores import sequence_window_scores
from sglang_pask.policy.distortion import attention_distortion
from sglang_pask.srt.kv_views import KVViewTable
from sglang_pask.srt.layer_group_pool import LayerGroupMHAKVPool
from sglang_pask.srt.structkv_pass import PASS_ATTRIBUTE, StructKVPass

# One request's read list in one group: (positions (k,) int64, physical slots (k,) int64).
ReadList = tuple[torch.Tensor, torch.Tensor]


class LayerGroupTorchNativeAttnBackend(TorchNativeAttnBackend):
    """torch_native attention over per-layer-group views of each request's KV."""

    def __init__(self, model_runner: Any):
        super().__init__(model_runner)
        pool = self.token_to_kv_pool
        self.grouped = isinstance(pool, LayerGroupMHAKVPool) and getattr(pool, "views", None) is not None
        self.views: Optional[KVViewTable] = pool.views if self.grouped else None
        self._reads: dict[int, list[ReadList]] = {}
        self._batch: list[tuple[int, int, int, int]] = []

    def init_forward_metadata(self, forward_batch: Any) -> None:
        super().init_forward_metadata(forward_batch)
        if not self.grouped:
            return
        self._reads = {}
        rows = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens_cpu.tolist() if forward_batch.seq_lens_cpu is not None \
            else forward_batch.seq_lens.tolist()
        if forward_batch.forward_mode.is_decode():
            extend_lens = [1] * len(rows)
        else:
            extend_lens = list(forward_batch.extend_seq_lens_cpu or [])
        # (row, seq_len, prefix_len, new tokens) per request in batch order.
        self._batch = [(row, n, n - e, e) for row, n, e in zip(rows, seq_lens, extend_lens)]
        assert self.views is not None
        for row, _, prefix_len, _ in self._batch:
            self.views.view(row, prefix_len)

    def _read_lists(self, group: int) -> list[ReadList]:
        """Each request's positions and physical slots in ``group`` (built once per forward)."""
        found = self._reads.get(group)
        if found is not None:
            return found
        assert self.views is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        req_to_token = self.req_to_token_pool.req_to_token
        lists = []
        for row, seq_len, _, _ in self._batch:
            positions = self.views.views[row].groups[group].positions(seq_len, req_to_token.device)
            physical = pool.physical(group, req_to_token[row, positions])
            present = physical > 0
            if not bool(present.all()):
                positions, physical = positions[present], physical[present]
            lists.append((positions, physical))
        self._reads[group] = lists
        return lists

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        prune = getattr(forward_batch, PASS_ATTRIBUTE, None)
        return self._forward(q, k, v, layer, save_kv_cache, forward_batch.out_cache_loc, is_extend=True,
                             prune=prune)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):  # noqa: D102 (SGLang's API)
        if not self.grouped:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
        return self._forward(q, k, v, layer, save_kv_cache, forward_batch.out_cache_loc, is_extend=False)

    def _forward(self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], layer: Any,
                 save_kv_cache: bool, out_cache_loc: torch.Tensor, is_extend: bool,
                 prune: Optional[StructKVPass] = None) -> torch.Tensor:
        """Write the step's K/V, attend each request over its group's read list, score, compress.

        ``q``: ``(tokens, q_heads * head_dim)``; returns ``(tokens, q_heads * v_head_dim)``. With a
        StructKV pass, ``tokens`` are the pass's current rows.
        """
        _refuse_unsupported(layer)
        if prune is not None:
            out_cache_loc = prune.out_cache_loc
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(out_cache_loc, None), k, v)
        output = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        queries = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim).movedim(0, 1)
        outputs = output.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        group = pool.layer_group[layer.layer_id - pool.start_layer]
        k_cache = pool.get_key_buffer(layer.layer_id)
        v_cache = pool.get_value_buffer(layer.layer_id)
        assert self.views is not None
        score = self.views.needs_scores and (prune is None or prune.feeds_policy_scores())
        counts = prune.counts if prune is not None else [new for _, _, _, new in self._batch]
        start = 0
        for index, ((row, seq_len, prefix_len, _), (positions, physical), new) in enumerate(
                zip(self._batch, self._read_lists(group), counts)):
            if prune is not None:
                computed = prune.computed(index, layer.layer_id)
                if computed is not None:
                    readable = (positions < prefix_len) | torch.isin(positions, computed)
                    positions, physical = positions[readable], physical[readable]
            query = queries[:, start:start + new, :]
            keys = k_cache[physical].movedim(0, 1)
            values = v_cache[physical].movedim(0, 1)
            if keys.dtype != query.dtype:
                keys, values = keys.to(query.dtype), values.to(query.dtype)
            if is_extend:
                # SGLang's shape: queries placed after the read prefix, causal over the whole list.
                padded = query.new_empty((query.shape[0], physical.numel(), query.shape[2]))
                padded[:, physical.numel() - new:, :] = query
                out = scaled_dot_product_attention(
                    padded.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                    enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num, scale=layer.scaling, is_causal=True,
                )[0, :, physical.numel() - new:, :]
            else:
                out = scaled_dot_product_attention(
                    query.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                    enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num, scale=layer.scaling, is_causal=False,
                )[0]
            outputs[start:start + new] = out.movedim(0, 1)
            probe = self.views.views[row].probe
            if is_extend and probe is not None and probe.distortion_budget is not None:
                window_q = query[:, max(0, new - self.views.score_window):, :].movedim(0, 1)
                self.views.add_distortion(row, group, attention_distortion(
                    window_q, keys.movedim(0, 1), values.movedim(0, 1), layer.scaling, probe.distortion_budget,
                    self.views.window,
                ))
            if prune is not None:
                scored = min(new, prune.settings.window)
                window_q = query[:, new - scored:, :].movedim(0, 1).float()
                per_head = sequence_window_scores(window_q, keys.movedim(0, 1).float(), layer.scaling)
                prune.add_scores(index, layer.layer_id, positions, per_head.sum(dim=0))
            if score:
                scored = self.views.score_queries(new)
                window_q = query[:, new - scored:, :].movedim(0, 1).float()
                per_head = sequence_window_scores(window_q, keys.movedim(0, 1).float(), layer.scaling)
                self.views.add_scores(row, group, positions, per_head.sum(dim=0), scored)
            start += new
        if prune is not None:
            if layer.layer_id == len(pool.layer_group) - 1:
                self._finish_structkv(prune)
        elif layer.layer_id == pool.layout.last_layers()[group]:
            self._finish_group(group, is_extend)
        return output

    def _finish_structkv(self, prune: StructKVPass) -> None:
        """After the model's last layer under StructKV: every group keeps what the pass chooses of
        each request's fresh tokens; then the step closes."""
        assert self.views is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        for group, layers in enumerate(pool.layout.ranges):
            for index, (row, seq_len, _, _) in enumerate(self._batch):
                self.views.keep_only(row, group, seq_len, prune.kv_keep(index, group, layers))
        for index, (row, seq_len, _, _) in enumerate(self._batch):
            self.views.views[row].prefill = prune.report(index)
            self.views.finish_step(row, seq_len, True)

    def _finish_group(self, group: int, is_extend: bool) -> None:
        """After a group's last layer: compress it per request; after the last group, close the step."""
        assert self.views is not None
        last = group == len(self.views.group_budgets) - 1
        for row, seq_len, _, _ in self._batch:
            self.views.finish_group(row, group, seq_len, is_extend)
            if last:
                self.views.finish_step(row, seq_len, is_extend)


def _refuse_unsupported(layer: Any) -> None:
    if layer.is_cross_attention or (layer.sliding_window_size is not None and layer.sliding_window_size > -1):
        raise NotImplementedError(
            "sglang-pask layer groups support causal full-attention decoder layers only "
            f"(layer {layer.layer_id} is cross-attention or sliding-window)"
        )
