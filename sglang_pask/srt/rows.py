"""Request-pool rows entering and leaving the layer-group pool (hooks of SGLang's ``ReqToTokenPool``).

* ``ReqToTokenPool.alloc`` (AFTER): each admitted request's row is remembered, for role lookups
  (:class:`~.roles.RequestRoles`).
* ``ReqToTokenPool.free`` / ``free_rows`` (AROUND): a request leaving the pool leaves the views;
  its final KV statistics go on the request (``req.pask_kv_stats``,
  :func:`~sglang_pask.api.kv_stats.request_stats`) for its response, with the positions each group
  kept if the request asked (``return_kv_kept``). (Under a low-bit ``--kv-dropped`` mode the blocks
  belong to their tokens' ids and go with them: :mod:`sglang_pask.kvpool.lowbit`.)
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_pask.api.flags import KEPT_FLAG, wants
from sglang_pask.api.kv_stats import STATS_ATTRIBUTE, request_stats
from sglang_pask.kvpool.probe import distortion_report
from sglang_pask.srt.active_pool import active


def release_request(original: Any, req_pool: Any, req: Any) -> Any:
    """AROUND hook of ``ReqToTokenPool.free``: keep the request's final KV statistics, drop its views."""
    state = active()
    row = int(req.kv.req_pool_idx)
    request = state.views.views.get(row) if state is not None and state.views is not None else None
    held = state.held_positions(row, request, req_pool.req_to_token) if request is not None else None
    lowbit, lowbit_slots, block_places = None, None, None
    if request is not None and state.lowbit is not None:
        lowbit_row = req_pool.req_to_token[row, : request.seq_len]
        lowbit, lowbit_slots = state.lowbit.row_summary(lowbit_row)
        if wants(req, KEPT_FLAG):
            block_places = [places.as_dict() for places in state.lowbit.row_block_places(lowbit_row)]
    result = original(req_pool, req)  # frees the row through free_rows, which drops the views
    if state is not None and state.views is not None:
        state.views.release(row)
        if request is not None:
            assert held is not None
            stats = request_stats(
                request.seq_len,
                held,
                state.config.kv_budget,
                state.budgets,
                state.config.kv_policy,
                kept_positions=wants(req, KEPT_FLAG),
                kv_dropped=state.config.kv_dropped,
                lowbit=lowbit,
                lowbit_slots=lowbit_slots,
                block_places=block_places,
                structkv=request.prefill,
                distortion=distortion_report(request),
            )
            setattr(req, STATS_ATTRIBUTE, stats)
    return result


def release_rows(original: Any, req_pool: Any, indices: Any) -> Any:
    """AROUND hook of ``ReqToTokenPool.free_rows``: rows freed without a request leave the views."""
    result = original(req_pool, indices)
    state = active()
    if state is not None and state.views is not None and state.requests is not None:
        for row in indices.tolist() if isinstance(indices, torch.Tensor) else list(indices):
            state.views.release(int(row))
            state.requests.forget(int(row))
    return result


def remember_rows(result: Any, req_pool: Any, reqs: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``ReqToTokenPool.alloc``: each admitted request's row, for role lookups."""
    state = active()
    if state is not None and state.requests is not None:
        state.requests.on_alloc(result, req_pool, reqs)
    return result
