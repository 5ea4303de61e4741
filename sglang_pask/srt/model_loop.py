"""StructKV's layer loop for SGLang's Qwen2, Qwen3 and Llama models (an AROUND hook of ``forward``).

``Qwen2Model.forward``, ``Qwen3Model.forward`` and ``LlamaModel.forward`` share one shape: embed the
tokens, start the residual stream, run every decoder layer on ``(positions, hidden_states,
forward_batch)``, apply the final norm. :func:`structkv_forward` wraps them. For an eligible extend
batch it runs the same steps itself, with a :class:`~sglang_pask.structkv.forward_pass.StructKVPass` on the batch:

1. Every layer runs as in SGLang; the attention backend reports each layer's last-window scores to
   the pass, which folds them into each request's centrality and statistics.
2. After the layer that settles a request's pivot (:class:`~sglang_pask.structkv.PromptPruning`), the
   batch's rows shrink to every request's skeleton: the residual stream's hidden states and residual,
   the positions (rotary embeddings see original positions) and the KV write slots are gathered with
   :mod:`sglang_pask.kernels.skeleton_gather` (Triton on CUDA, its torch reference elsewhere). In
   GemFilter mode the prefill restarts from the embeddings of the skeleton rows at layer 0.
3. After the final norm the skeleton rows are scattered back into ``(T, D)`` (rows outside the
   skeleton are 0): SGLang's logits processor reads each request's last row, which the window keeps.

Eligible: an extend pass without speculative decoding, input embeddings, pipeline parallelism or
captured hidden states, on the layer-group attention backend, in a model of at least 3 layers.
Anything else runs SGLang's own forward unchanged (no StructKV for that batch). The decision to prune
is per request: a prompt shorter than ``--structkv-min-prompt``, or one that asked for the logprobs
of its prompt tokens, computes every layer on all its tokens and keeps the KV its ``--kv-policy``
chooses (:meth:`~sglang_pask.structkv.forward_pass.StructKVPass.prunes`), while the other requests of
its batch are pruned as they would be alone; a batch with nothing to prune runs SGLang's own forward.

Semantics (README, "StructKV"): only the part of each prompt that the pass computes is pruned (a
prefix matched in the radix cache is reused as cached, never dropped); chunked prefill is off under
StructKV (the launcher), so that part is the whole uncached prompt; each request of a batch has its
own pivot and skeleton; decode positions continue from the original prompt length (sequence lengths
are never changed) and generated tokens are compressed by the ``--kv-policy``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import get_attn_backend

from sglang_pask.kernels.skeleton_gather import (
    skeleton_gather_reference,
    skeleton_gather_triton,
    skeleton_scatter_reference,
    skeleton_scatter_triton,
)
from sglang_pask.srt.grammar import process_vocab
from sglang_pask.structkv import segment_end_table
from sglang_pask.structkv.forward_pass import PASS_ATTRIBUTE, StructKVPass, StructKVSettings

logger = logging.getLogger(__name__)

MODEL_FORWARDS: tuple[str, ...] = (
    "sglang.srt.models.qwen2.Qwen2Model.forward",
    "sglang.srt.models.qwen3.Qwen3Model.forward",
    "sglang.srt.models.llama.LlamaModel.forward",
)


def structkv_forward(settings: StructKVSettings):
    """The AROUND hook of a model's ``forward`` for ``settings``."""

    def forward(
        original: Any,
        model: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        input_embeds: Optional[torch.Tensor] = None,
        pp_proxy_tensors: Any = None,
        **kwargs: Any,
    ) -> Any:
        prune = _begin(settings, model, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors, kwargs)
        if prune is None:
            return original(
                model, input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors=pp_proxy_tensors, **kwargs
            )
        setattr(forward_batch, PASS_ATTRIBUTE, prune)
        try:
            hidden = _run_layers(model, input_ids, forward_batch, prune)
            hidden = residual_batch.final_norm(hidden, forward_batch, model.norm)
            if prune.rows.numel() == positions.numel():
                return hidden
            out = hidden.new_zeros((positions.numel(), hidden.shape[1]))
            scatter = skeleton_scatter_triton if hidden.is_cuda else skeleton_scatter_reference
            return scatter(hidden, prune.rows, out)
        finally:
            setattr(forward_batch, PASS_ATTRIBUTE, None)

    return forward


def _begin(
    settings: StructKVSettings,
    model: Any,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    forward_batch: Any,
    input_embeds: Optional[torch.Tensor],
    pp_proxy_tensors: Any,
    kwargs: dict,
) -> Optional[StructKVPass]:
    """A pass for this batch, or None when StructKV does not apply to it (see the module docstring)."""
    if forward_batch.forward_mode != ForwardMode.EXTEND:
        return None
    if input_embeds is not None or pp_proxy_tensors is not None or kwargs or forward_batch.spec_info is not None:
        return None
    if getattr(model, "layers_to_capture", None) or not model.pp_group.is_first_rank or not model.pp_group.is_last_rank:
        return None
    capture = getattr(forward_batch, "capture_hidden_mode", None)
    if capture is not None and capture.need_capture():
        return None
    backend = get_attn_backend()
    views = getattr(backend, "views", None)
    num_layers = model.end_layer - model.start_layer
    if views is None or model.start_layer != 0 or num_layers < 3:
        return None
    pool = backend.token_to_kv_pool
    extend_lens = list(forward_batch.extend_seq_lens_cpu)
    prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
    rows = forward_batch.req_pool_indices.tolist()
    if sum(extend_lens) != positions.numel():
        return None
    unpruned = _wants_prompt_logprobs(forward_batch, extend_lens)
    if not any(settings.prunes(p + n) and not u for p, n, u in zip(prefix_lens, extend_lens, unpruned)):
        return None  # no prompt to prune (all short, or asking for prompt logprobs): SGLang's own forward
    segment_ends = None
    if settings.segments:
        table = _segment_end_table(input_ids.device)
        if table is None:
            return None
        segment_ends = table[input_ids.clamp(0, table.numel() - 1)]
    return StructKVPass(
        settings,
        num_layers,
        list(pool.layer_group),
        rows,
        prefix_lens,
        extend_lens,
        positions,
        forward_batch.out_cache_loc,
        segment_ends,
        unpruned,
    )


def _wants_prompt_logprobs(forward_batch: Any, extend_lens: list[int]) -> list[bool]:
    """Per request of the batch: whether it asked for the logprobs of prompt tokens it computes now
    (``logprob_start_len`` inside its extend), so the logits processor reads rows a skeleton would
    not compute. Logprobs of output tokens only read the last row, which every skeleton keeps."""
    starts = forward_batch.extend_logprob_start_lens_cpu
    if not forward_batch.return_logprob or starts is None:
        return [False] * len(extend_lens)
    return [start < n for start, n in zip(starts, extend_lens)]


_segment_tables: dict[torch.device, torch.Tensor] = {}
_missing_vocab_logged: list[bool] = []


def _segment_end_table(device: torch.device) -> Optional[torch.Tensor]:
    """``(V,)`` bool on ``device``: which token ids of this process's model end a segment, from the
    vocabulary the grammar backend read (:func:`~sglang_pask.srt.grammar.process_vocab`); None
    (and a logged error, once) when there is none, so the batch runs unpruned."""
    found = _segment_tables.get(device)
    if found is not None:
        return found
    vocab = process_vocab()
    if vocab is None:
        if not _missing_vocab_logged:
            _missing_vocab_logged.append(True)
            logger.error(
                "sglang-pask: StructKV's segment skeleton needs the xgrammar grammar backend's vocabulary, "
                "which this scheduler has not built; prompts are not pruned"
            )
        return None
    table = segment_end_table(vocab.token_bytes, vocab.special_ids).to(device)
    _segment_tables[device] = table
    return table


def _run_layers(model: Any, input_ids: torch.Tensor, forward_batch: Any, prune: StructKVPass) -> Any:
    """Embed and run the decoder layers, shrinking the rows when requests settle their pivots."""
    hidden = model.embed_tokens(input_ids)
    residual_batch.start(forward_batch)
    layer = 0
    while layer < prune.num_layers:
        hidden = model.layers[layer](prune.positions, hidden, forward_batch)
        settled = prune.after_layer(layer)
        shrinking = [i for i in settled if prune.requests[i].decision.skeleton.numel() < prune.requests[i].length]
        if not shrinking:
            layer += 1
            continue
        keep_local = [
            prune.requests[i].decision.skeleton if i in settled else torch.arange(count, device=prune.rows.device)
            for i, count in enumerate(prune.counts)
        ]
        restart = prune.restarts
        if restart:
            current = _gather_rows(prune, keep_local)
            prune.apply(current, keep_local, restart=True)
            hidden = model.embed_tokens(input_ids[prune.rows])
            residual_batch.start(forward_batch)
            layer = 0
            continue
        hidden = _gather_stream(hidden, forward_batch, prune, keep_local)
        layer += 1
    return hidden


def _gather_rows(prune: StructKVPass, keep_local: list[torch.Tensor]) -> torch.Tensor:
    """``(K',)`` int64: the kept rows among the pass's current rows."""
    keep_indices, keep_indptr = prune.select(keep_local)
    starts = prune.indptr()[:-1]
    return keep_indices + torch.repeat_interleave(starts, keep_indptr.diff())


def _gather_stream(hidden: Any, forward_batch: Any, prune: StructKVPass, keep_local: list[torch.Tensor]) -> Any:
    """Gather the kept rows of the residual stream (layer output and residual) and of the pass.

    SGLang's stream between layers holds the layer's output (a pending contribution) and the residual
    it will be added to at the next layer's input norm; both are gathered as they are, so the
    addition and its rounding happen where SGLang does them. Only a plain residual update (the
    add-and-norm of Qwen2, Qwen3 and Llama) is supported.
    """
    stream = residual_batch.stream_of(forward_batch)
    value = stream.complete(hidden)
    pending = stream.pending
    if pending is not None and not pending.update.is_plain_add:
        raise NotImplementedError("StructKV gathers a plain residual stream only (add-and-norm decoder layers)")
    keep_indices, keep_indptr = prune.select(keep_local)
    gather = skeleton_gather_triton if value.is_cuda else skeleton_gather_reference
    residual = stream.residual if pending is not None else None
    kept = gather(value, prune.positions, prune.indptr(), keep_indices, keep_indptr, residual=residual)
    prune.apply(kept.rows, keep_local, restart=False)
    if pending is None:
        return residual_batch.set_written(kept.hidden_states, forward_batch)
    pending.value = kept.hidden_states
    stream.residual = kept.residual
    return kept.hidden_states
