"""What every layer-group attention backend does besides attending: read lists, scores, compression.

Mixed into SGLang's attention backends (:mod:`.torch_native` for torch_native, :mod:`.triton` for
triton), before the SGLang class. Per forward it records each request's row, length, cached prefix
and fresh tokens and makes its views (:mod:`sglang_pask.kvpool.views`, in the view table of
:mod:`sglang_pask.kvpool.compression`); per layer group it builds, once, each request's read list (the
positions its view of that group keeps, with the group's physical slots); per layer and request it
feeds StructKV's scores and the policy's scores, and a calibration request's distortion probe
(:mod:`sglang_pask.kvpool.probe`; looked up once per forward, only while such a request runs); after
a group's last layer it compresses the group, and after the last group it closes the step. The
attention itself stays the backend's.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_pask.kernels.window_scores import sequence_window_scores
from sglang_pask.kvpool import probe as probes
from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.kvpool.lowbit import LocatedTokens, LowBitStore
from sglang_pask.kvpool.probe import CalibrationProbe
from sglang_pask.srt.pool import LayerGroupMHAKVPool
from sglang_pask.structkv.forward_pass import StructKVPass

# One request's read list in one group: (positions (k,) int64, physical slots (k,) int64).
ReadList = tuple[torch.Tensor, torch.Tensor]
# One request in the forward: (request-pool row, length after the step, cached prefix, fresh tokens).
BatchEntry = tuple[int, int, int, int]


class LayerGroupReads:
    """Per-forward bookkeeping of the layer-group views, shared by the attention backends.

    The backend class calls :meth:`_init_group_reads` after SGLang's constructor, :meth:`_begin_forward`
    after SGLang's ``init_forward_metadata``, :meth:`_observe` for each request in each layer and
    :meth:`_end_layer` after each layer. Without a :class:`~sglang_pask.srt.pool.LayerGroupMHAKVPool`
    (e.g. a draft model) ``grouped`` is False and the backend is stock SGLang.
    """

    token_to_kv_pool: Any
    req_to_token_pool: Any

    def _init_group_reads(self) -> None:
        pool = self.token_to_kv_pool
        self.grouped = isinstance(pool, LayerGroupMHAKVPool) and getattr(pool, "views", None) is not None
        self.views: Optional[KVViewTable] = pool.views if self.grouped else None
        self.lowbit: Optional[LowBitStore] = getattr(pool, "lowbit", None) if self.grouped else None
        self._reads: dict[int, list[ReadList]] = {}
        self._lowbit_reads: dict[int, list[Optional[LocatedTokens]]] = {}
        self._batch: list[BatchEntry] = []
        # Batch index -> distortion probe, for this forward's requests that carry one (usually none).
        self._distortion_probes: dict[int, CalibrationProbe] = {}

    def _begin_forward(self, forward_batch: Any, requests: Optional[int] = None) -> None:
        """Record the forward's requests in batch order and make sure each has its view; with
        ``requests``, only the first that many (a CUDA-graph batch's rows after them are padding)."""
        self._reads = {}
        self._lowbit_reads = {}
        rows = forward_batch.req_pool_indices[:requests].tolist()
        seq_lens = (
            forward_batch.seq_lens_cpu[:requests].tolist()
            if forward_batch.seq_lens_cpu is not None
            else forward_batch.seq_lens[:requests].tolist()
        )
        if forward_batch.forward_mode.is_decode():
            extend_lens = [1] * len(rows)
        else:
            extend_lens = list(forward_batch.extend_seq_lens_cpu or [])
        self._batch = [(row, n, n - e, e) for row, n, e in zip(rows, seq_lens, extend_lens)]
        assert self.views is not None
        for row, _, prefix_len, _ in self._batch:
            self.views.view(row, prefix_len)
        self._distortion_probes = {}
        if self.views.probes:
            for index, (row, _, _, _) in enumerate(self._batch):
                probe = self.views.probes.get(row)
                if probe is not None and probe.distortion_budget is not None:
                    self._distortion_probes[index] = probe

    def _layer_group(self, layer: Any) -> int:
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool
        return pool.layer_group[layer.layer_id - pool.start_layer]

    def _read_lists(self, group: int) -> list[ReadList]:
        """Each request's positions (ascending) and physical slots in ``group``, built once per
        forward; positions the pool no longer holds (dropped before they reached the prefix cache)
        are left out."""
        found = self._reads.get(group)
        if found is not None:
            return found
        assert self.views is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool
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

    def _attend_gathered(
        self, q: torch.Tensor, layer: Any, group: int, is_extend: bool, prune: Optional[StructKVPass]
    ) -> torch.Tensor:
        """Attend each request over its group's read list and its low-bit tokens (dequantized),
        gathered and run through SDPA one request at a time, and feed what it read to the probe, the
        StructKV pass and the policy. The step's K/V must be written already.

        ``q``: ``(tokens, q_heads * head_dim)``; returns ``(tokens, q_heads * v_head_dim)``. With a
        StructKV pass, ``tokens`` are the pass's current rows.
        """
        output = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        queries = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim).movedim(0, 1)
        outputs = output.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool  # type: ignore[assignment]
        k_cache = pool.get_key_buffer(layer.layer_id)
        v_cache = pool.get_value_buffer(layer.layer_id)
        score = self._scores_needed(prune, is_extend)
        start = 0
        for index, (read, new) in enumerate(zip(self._read_lists(group), self._row_counts(prune))):
            positions, physical = self._readable(index, read, prune, layer.layer_id)
            query = queries[:, start : start + new, :]
            keys = k_cache[physical].movedim(0, 1)
            values = v_cache[physical].movedim(0, 1)
            if keys.dtype != query.dtype:
                keys, values = keys.to(query.dtype), values.to(query.dtype)
            read_keys, read_values = keys, values
            lowbit = self._lowbit_kv(index, group, layer.layer_id, query.dtype)
            if lowbit is not None:
                read_keys, read_values = torch.cat((lowbit[0], keys), dim=1), torch.cat((lowbit[1], values), dim=1)
            total = read_keys.shape[1]
            if is_extend:
                # SGLang's shape: queries placed after the read prefix, causal over the whole list.
                padded = query.new_empty((query.shape[0], total, query.shape[2]))
                padded[:, total - new :, :] = query
                out = scaled_dot_product_attention(
                    padded.unsqueeze(0),
                    read_keys.unsqueeze(0),
                    read_values.unsqueeze(0),
                    enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
                    scale=layer.scaling,
                    is_causal=True,
                )[0, :, total - new :, :]
            else:
                out = scaled_dot_product_attention(
                    query.unsqueeze(0),
                    read_keys.unsqueeze(0),
                    read_values.unsqueeze(0),
                    enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
                    scale=layer.scaling,
                    is_causal=False,
                )[0]
            outputs[start : start + new] = out.movedim(0, 1)
            # The policy scores, and the probe measures, the full-precision read list only.
            self._observe(index, group, layer, query, keys, values, positions, is_extend, prune, score)
            start += new
        return output

    def _lowbit_located(self, group: int) -> list[Optional[LocatedTokens]]:
        """Per request of the batch, its low-bit tokens in ``group`` (all before the step's fresh
        tokens), None where it has none; all None without a low-bit ``--kv-dropped`` mode. Located
        once per forward and group."""
        if self.lowbit is None:
            return [None] * len(self._batch)
        located = self._lowbit_reads.get(group)
        if located is None:
            req_to_token = self.req_to_token_pool.req_to_token
            located = self._lowbit_reads[group] = [
                self.lowbit.locate(group, req_to_token[row, :prefix_len]) for row, _, prefix_len, _ in self._batch
            ]
        return located

    def _lowbit_kv(
        self, index: int, group: int, layer_id: int, dtype: torch.dtype
    ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Request ``index``'s low-bit tokens in layer ``layer_id`` (a low-bit ``--kv-dropped`` mode), dequantized to
        ``dtype``: keys and values ``(kv_heads, t, head_dim)``; None when it has none there. They are
        all positions before the step's fresh tokens (its cached prefix, shared or not), which the
        causal mask needs last."""
        located = self._lowbit_located(group)[index]
        if located is None:
            return None
        assert self.lowbit is not None
        keys, values = self.lowbit.read(located, layer_id)
        return keys.to(dtype).movedim(0, 1), values.to(dtype).movedim(0, 1)

    def _row_counts(self, prune: Optional[StructKVPass]) -> list[int]:
        """Rows (queries) each request has in the current layer: its fresh tokens, or under StructKV
        the rows the pass computes now."""
        return prune.counts if prune is not None else [new for _, _, _, new in self._batch]

    def _readable(self, index: int, read: ReadList, prune: Optional[StructKVPass], layer_id: int) -> ReadList:
        """Request ``index``'s read list cut, under StructKV, to what it has K/V for in layer
        ``layer_id``: its cached prefix and the fresh tokens the pass computes now (the others were
        never written in this layer). Without a pass, or while it computes every row, ``read``."""
        positions, physical = read
        computed = prune.computed(index, layer_id) if prune is not None else None
        if computed is None:
            return read
        readable = (positions < self._batch[index][2]) | torch.isin(positions, computed)
        return positions[readable], physical[readable]

    def _scores_needed(self, prune: Optional[StructKVPass], is_extend: bool) -> bool:
        """Whether the policy's scores must be computed in this forward."""
        assert self.views is not None
        return self.views.scores_needed(is_extend) and (prune is None or prune.feeds_policy_scores())

    def _distortion_probe(self, index: int, is_extend: bool) -> Optional[CalibrationProbe]:
        """The distortion probe of request ``index``, measured in extend passes only; None for every
        request but a calibration request's."""
        if not self._distortion_probes or not is_extend:
            return None
        return self._distortion_probes.get(index)

    def _observe(
        self,
        index: int,
        group: int,
        layer: Any,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        is_extend: bool,
        prune: Optional[StructKVPass],
        score: bool,
    ) -> None:
        """Feed one request's step in one layer to the probe, the StructKV pass and the policy.

        Parameters
        ----------
        index : int
            The request's place in the batch.
        query : Tensor
            ``(q_heads, new, head_dim)``: the request's queries of the step, in the backend's dtype.
        keys, values : Tensor
            ``(kv_heads, k, head_dim)``: what the request read in this layer, in ``positions`` order.
        positions : Tensor
            ``(k,)`` int64 positions of ``keys``.
        score : bool
            Whether the policy's scores are computed (:meth:`_scores_needed`).
        """
        assert self.views is not None
        row = self._batch[index][0]
        new = query.shape[1]
        probe = self._distortion_probe(index, is_extend)
        if probe is not None:
            probes.record_distortion(self.views, row, group, query, keys, values, layer.scaling, probe)
        if prune is not None and prune.prunes(index):
            scored = min(new, prune.settings.score_window)
            window_q = query[:, new - scored :, :].movedim(0, 1).float()
            keys_f = keys.movedim(0, 1).float()
            per_head = sequence_window_scores(window_q, keys_f, layer.scaling)
            counted = prune.statistics_queries(index, scored)
            statistics = (
                None
                if counted is None
                else sequence_window_scores(window_q[scored - counted :], keys_f, layer.scaling).sum(dim=0)
            )
            prune.add_scores(index, layer.layer_id, positions, per_head.sum(dim=0), statistics)
        if score:
            scored = self.views.score_queries(new)
            window_q = query[:, new - scored :, :].movedim(0, 1).float()
            per_head = sequence_window_scores(window_q, keys.movedim(0, 1).float(), layer.scaling)
            self.views.add_scores(row, group, positions, per_head.sum(dim=0), scored)

    def _end_layer(self, layer: Any, is_extend: bool, prune: Optional[StructKVPass]) -> None:
        """After a layer: under StructKV, after the model's last layer, apply the pass's keep sets;
        otherwise, after a group's last layer, compress that group."""
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool
        if prune is not None:
            if layer.layer_id == len(pool.layer_group) - 1:
                self._finish_structkv(prune)
        elif layer.layer_id == pool.layout.last_layers()[self._layer_group(layer)]:
            self._finish_group(self._layer_group(layer), is_extend)

    def _finish_structkv(self, prune: StructKVPass) -> None:
        """After the model's last layer under StructKV: every group keeps what the pass chooses of
        each pruned request's fresh tokens, and compresses each unpruned request as without StructKV
        (its scores were folded in every layer); then the step closes."""
        assert self.views is not None
        pool: LayerGroupMHAKVPool = self.token_to_kv_pool
        for group, layers in enumerate(pool.layout.ranges):
            self.views.share_scores(group, [row for row, _, _, _ in self._batch])
            for index, (row, seq_len, _, _) in enumerate(self._batch):
                if prune.prunes(index):
                    self.views.keep_only(row, group, seq_len, prune.kv_keep(index, group, layers))
                else:
                    self.views.finish_group(row, group, seq_len, True)
        for index, (row, seq_len, _, _) in enumerate(self._batch):
            self.views.views[row].prefill = prune.report(index)
            self.views.finish_step(row, seq_len, True)

    def _finish_group(self, group: int, is_extend: bool) -> None:
        """After a group's last layer: compress it per request; after the last group, close the step."""
        assert self.views is not None
        last = group == len(self.views.group_budgets) - 1
        self.views.share_scores(group, [row for row, _, _, _ in self._batch])
        for row, seq_len, _, _ in self._batch:
            self.views.finish_group(row, group, seq_len, is_extend)
            if last:
                self.views.finish_step(row, seq_len, is_extend)


def refuse_unsupported_layer(layer: Any) -> None:
    """Layer groups support causal full-attention decoder layers only; anything else is an error."""
    if layer.is_cross_attention or (layer.sliding_window_size is not None and layer.sliding_window_size > -1):
        raise NotImplementedError(
            "sglang-pask layer groups support causal full-attention decoder layers only "
            f"(layer {layer.layer_id} is cross-attention or sliding-window)"
        )
