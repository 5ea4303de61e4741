"""Wiring of the layer-group KV pool into SGLang's scheduler process.

Hooks (registered by :mod:`.hooks`):

* ``KVCacheConfigurator._build_mha_kv_pool`` (AROUND): the policy's group budgets size each group's
  slots (:mod:`sglang_pask.kvpool.sizing`, same bytes as SGLang's pool), and SGLang builds its MHA pool as usual,
  of our class :class:`~.layer_group_pool.LayerGroupMHAKVPool` bound to that layout.
* ``KVCacheConfigurator._build_token_to_kv_pool_allocator`` (AROUND): a
  :class:`~.layer_group_pool.LayerGroupAllocator` over ``V`` virtual ids and the request views
  (:class:`~sglang_pask.kvpool.compression.KVViewTable`) with the policy and its group budgets.
* ``KVCacheConfigurator.configure`` (AFTER): the scheduler's token capacity becomes ``V``.
* ``ReqToTokenPool.free`` / ``free_rows`` (AROUND): a request leaving the pool leaves the views;
  its final KV statistics go on the request (``req.pask_kv_stats``) for its response, with the
  positions each group kept if the request asked (``return_kv_kept``). (Under a low-bit
  ``--kv-dropped`` mode the blocks belong to their tokens' ids and go with them: :mod:`sglang_pask.kvpool.lowbit`.)
* ``InvariantChecker._check_full_pool`` (AROUND): the idle leak check counts virtual ids and checks
  every group's slot conservation.

One scheduler process holds one pool: :func:`active` returns it (for ``/server_info``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import msgspec
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from sglang_pask.config import KV_DROPPED_BITS, PaskConfig
from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS
from sglang_pask.policy import KVPolicy, plan_group_budgets
from sglang_pask.policy.resolve import build_policy
from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.kvpool.lowbit import BlockFormat, LowBitStore
from sglang_pask.kvpool.probe import distortion_report
from sglang_pask.kvpool.sizing import plan_layout
from sglang_pask.kvpool.views import RequestView
from sglang_pask.srt.request_flags import KEPT_FLAG, wants
from sglang_pask.srt.request_roles import RequestRoles
from sglang_pask.srt.layer_group_pool import LayerGroupAllocator, LayerGroupMHAKVPool

STATS_ATTRIBUTE = "pask_kv_stats"


@dataclass
class ActivePool:
    """The scheduler process's layer-group pool, allocator, views and configuration."""

    config: PaskConfig
    policy: KVPolicy
    budgets: list[float]
    pool: LayerGroupMHAKVPool
    allocator: Optional[LayerGroupAllocator] = None
    views: Optional[KVViewTable] = None
    requests: Optional[RequestRoles] = None
    lowbit: Optional[LowBitStore] = None

    @property
    def storage_budgets(self) -> list[float]:
        """``(num_groups,)`` each group's share of full KV's slots per request: its budget, or under a
        low-bit ``--kv-dropped`` mode its budget plus the blocks of the rest
        (:meth:`.BlockFormat.storage_budget`)."""
        block_format = lowbit_format(self.config)
        if block_format is None:
            return list(self.budgets)
        return [block_format.storage_budget(b, self.pool.store_dtype.itemsize) for b in self.budgets]

    def held_positions(self, row: int, request: RequestView, req_to_token: torch.Tensor) -> list[torch.Tensor]:
        """``(num_groups,)`` of ``(k_g,)`` int64 ascending, on the pool's device: the positions each
        group read for the request at its last step that the pool still holds (a shared prefix may
        lack tokens that an earlier request dropped). Copied to the host only if a request asks."""
        held = []
        for group, view in enumerate(request.groups):
            positions = view.positions(request.seq_len, req_to_token.device)
            held.append(positions[self.pool.physical(group, req_to_token[row, positions]) > 0])
        return held

    def usage(self) -> dict[str, Any]:
        """Pool usage now (and peaks since start): requests holding KV, per group slots and bytes in
        use, and the full-KV equivalent of the tokens held."""
        assert self.allocator is not None
        layout = self.pool.layout
        groups = []
        for g, layers in enumerate(layout.ranges):
            used = self.allocator.group_used_slots(g)
            groups.append({
                "layers": f"{layers[0]}-{layers[-1]}",
                "budget": self.budgets[g],
                "slots_in_use": used,
                "lowbit_slots_in_use": 0 if self.lowbit is None else int(self.lowbit.held_slots(g).numel()),
                "peak_slots_in_use": self.allocator.peak_group_used[g],
                "slots": layout.group_slots[g],
                "bytes_per_slot": self.pool.bytes_per_slot(g),
                "bytes_in_use": used * self.pool.bytes_per_slot(g),
                "bytes": self.pool.group_buffer_bytes(g),
            })
        tokens = layout.virtual_slots - self.allocator.virtual_available_size()
        full_bytes_per_token = sum(self.pool.bytes_per_slot(g) for g in range(layout.num_groups))
        assert self.views is not None
        return {
            "kv_dropped": self.config.kv_dropped,
            "lowbit_unstored_tokens": 0 if self.lowbit is None else self.lowbit.unstored_tokens,
            "running_requests": len(self.views.views),
            "peak_running_requests": self.views.peak_requests,
            "groups": groups,
            "tokens_in_use": tokens,
            "virtual_slots": layout.virtual_slots,
            "physical_slots": layout.physical_slots,
            "bytes_in_use": sum(group["bytes_in_use"] for group in groups),
            "bytes": sum(group["bytes"] for group in groups),
            "full_equivalent_bytes": tokens * full_bytes_per_token,
        }


_ACTIVE: Optional[ActivePool] = None


def lowbit_format(config: PaskConfig) -> Optional[BlockFormat]:
    """The block format of ``config``'s low-bit ``--kv-dropped`` mode; None under ``drop``."""
    bits = KV_DROPPED_BITS.get(config.kv_dropped)
    return None if bits is None else BlockFormat(*bits)


def active() -> Optional[ActivePool]:
    """This process's layer-group pool, once SGLang built it."""
    return _ACTIVE


def pool_builder(config: PaskConfig):
    """AROUND hook of ``KVCacheConfigurator._build_mha_kv_pool``: build our pool class."""

    def build(original: Any, configurator: Any, *, max_total_num_tokens: int, mha_pool_class: type,
              quant_method: Any = None) -> Any:
        global _ACTIVE
        if configurator.is_draft_worker:
            return original(configurator, max_total_num_tokens=max_total_num_tokens,
                            mha_pool_class=mha_pool_class, quant_method=quant_method)
        if mha_pool_class is not MHATokenToKVPool or quant_method is not None:
            raise RuntimeError(
                f"sglang-pask layer groups need SGLang's plain MHA KV pool, but this server would use "
                f"{mha_pool_class.__name__}{' with a quantized KV cache' if quant_method is not None else ''}"
            )
        layers = configurator.layer_info
        if layers.start_layer != 0:
            raise RuntimeError("sglang-pask layer groups do not support pipeline parallelism (the pool starts "
                               f"at layer {layers.start_layer})")
        num_layers = layers.num_effective_layers
        ranges = config.kv_layer_groups.resolve(num_layers)
        policy = build_policy(config.kv_policy, config.pask_policy, num_layers, ranges,
                              Path(configurator.model_config.model_path).name, config.kv_decode)
        budgets = plan_group_budgets(policy, config.kv_budget, [len(r) for r in ranges], config.kv_window,
                                     configurator.model_config.context_len)
        storage, block_rows = budgets, 0
        block_format = lowbit_format(config)
        if block_format is not None:
            itemsize = configurator.kv_cache_dtype.itemsize
            storage = [block_format.storage_budget(b, itemsize) for b in budgets]
            block_rows = block_format.rows_per_block(itemsize)
        layout = plan_layout(max_total_num_tokens, ranges, storage, _prefill_chunk(),
                             config.kv_window + policy.reserved_tokens + KVViewTable.DECODE_SLACK + block_rows)
        pool = original(configurator, max_total_num_tokens=max_total_num_tokens,
                        mha_pool_class=functools.partial(LayerGroupMHAKVPool, layout=layout), quant_method=None)
        _ACTIVE = ActivePool(config=config, policy=policy, budgets=budgets, pool=pool)
        return pool

    return build


def _prefill_chunk() -> Optional[int]:
    """The server's ``--chunked-prefill-size`` (None when chunked prefill is off)."""
    from sglang.srt.runtime_context import get_schedule

    size = get_schedule().chunked_prefill_size
    return size if size is not None and size > 0 else None


def build_allocator(original: Any, configurator: Any, *, sizes: Any, token_to_kv_pool: Any, is_dsv4_model: bool,
                    req_to_token_pool: Any, token_to_kv_pool_allocator: Any) -> Any:
    """AROUND hook of ``KVCacheConfigurator._build_token_to_kv_pool_allocator``."""
    state = _ACTIVE
    if state is None or token_to_kv_pool is not state.pool:
        return original(configurator, sizes=sizes, token_to_kv_pool=token_to_kv_pool, is_dsv4_model=is_dsv4_model,
                        req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=token_to_kv_pool_allocator)
    if state.pool.page_size != 1:
        raise RuntimeError(f"sglang-pask layer groups need --page-size 1, got {state.pool.page_size}")
    slack = KVViewTable.DECODE_SLACK
    block_format = lowbit_format(state.config)
    # Slots a request may hold in a group above its budget: the window, the policy's reserved tokens,
    # the decode slack and, under a low-bit --kv-dropped mode, the last partial block of a prefill pass.
    overhead = state.config.kv_window + state.policy.reserved_tokens + slack
    if block_format is not None:
        overhead += block_format.rows_per_block(state.pool.store_dtype.itemsize)
    allocator = LayerGroupAllocator(
        state.pool, configurator.kv_cache_dtype, configurator.device, need_sort=False,
        budgets=state.storage_budgets, growth_overhead=0 if min(state.budgets) >= 1.0 else overhead,
        prefill_chunk=_prefill_chunk(), compress_decode=state.config.kv_decode == "compress",
    )
    if block_format is not None:
        state.lowbit = allocator.lowbit = LowBitStore(block_format, state.pool, allocator)
    state.pool.lowbit = state.lowbit
    req_to_token = req_to_token_pool.req_to_token

    def drop(row: int, group: int, positions: torch.Tensor) -> None:
        virtual = req_to_token[row, positions]
        if state.lowbit is None:
            allocator.drop(group, virtual)
        else:
            state.lowbit.drop(group, virtual)

    def holds(row: int, group: int, positions: torch.Tensor) -> torch.Tensor:
        return state.pool.physical(group, req_to_token[row, positions]) > 0

    dropped_block = None
    if block_format is not None:
        dropped_block = (BLOCK_TOKENS, block_format.rows_per_block(state.pool.store_dtype.itemsize))
    state.allocator = allocator
    state.requests = RequestRoles()
    state.views = KVViewTable(state.policy, state.budgets, state.config.kv_window, drop, slack=slack,
                              score_window=state.config.kv_score_window,
                              compress_decode=state.config.kv_decode == "compress",
                              device=req_to_token.device, roles_of=state.requests.roles_of,
                              probe_of=state.requests.probe_of, holds=holds, dropped_block=dropped_block,
                              decode_block=BLOCK_TOKENS if state.config.kv_decode == "lowbit" else None)
    state.pool.views = state.views
    return allocator


def virtual_capacity(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``KVCacheConfigurator.configure``: the scheduler hands out ``V`` token ids."""
    state = _ACTIVE
    if state is None or result.token_to_kv_pool is not state.pool:
        return result
    return msgspec.structs.replace(result, max_total_num_tokens=state.pool.layout.virtual_slots)


def release_request(original: Any, req_pool: Any, req: Any) -> Any:
    """AROUND hook of ``ReqToTokenPool.free``: keep the request's final KV statistics, drop its views."""
    state = _ACTIVE
    row = int(req.kv.req_pool_idx)
    request = state.views.views.get(row) if state is not None and state.views is not None else None
    held = state.held_positions(row, request, req_pool.req_to_token) if request is not None else None
    lowbit, lowbit_slots, block_places = None, None, None
    if request is not None and state.lowbit is not None:
        lowbit_row = req_pool.req_to_token[row, :request.seq_len]
        lowbit, lowbit_slots = state.lowbit.row_summary(lowbit_row)
        if wants(req, KEPT_FLAG):
            block_places = [places.as_dict() for places in state.lowbit.row_block_places(lowbit_row)]
    result = original(req_pool, req)  # frees the row through free_rows, which drops the views
    if state is not None and state.views is not None:
        state.views.release(row)
        if request is not None:
            assert held is not None
            stats = {
                "full_tokens": request.seq_len,
                "kept_tokens": [int(positions.numel()) for positions in held],
                "budget": state.config.kv_budget,
                "group_budgets": state.budgets,
                "policy": state.config.kv_policy,
            }
            if lowbit is not None:
                stats["kv_dropped"] = state.config.kv_dropped
                stats["lowbit_tokens"] = [int(positions.numel()) for positions in lowbit]
                stats["lowbit_slots"] = lowbit_slots
            if wants(req, KEPT_FLAG):
                stats["kept_positions"] = [positions.tolist() for positions in held]
                if lowbit is not None:
                    stats["lowbit_positions"] = [positions.tolist() for positions in lowbit]
                    stats["lowbit_block_places"] = block_places
            if request.prefill is not None:
                stats["structkv"] = request.prefill
            distortion = distortion_report(request)
            if distortion is not None:
                stats["distortion"] = distortion
            setattr(req, STATS_ATTRIBUTE, stats)
    return result


def release_rows(original: Any, req_pool: Any, indices: Any) -> Any:
    """AROUND hook of ``ReqToTokenPool.free_rows``: rows freed without a request leave the views."""
    result = original(req_pool, indices)
    state = _ACTIVE
    if state is not None and state.views is not None and state.requests is not None:
        for row in (indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)):
            state.views.release(int(row))
            state.requests.forget(int(row))
    return result


def remember_rows(result: Any, req_pool: Any, reqs: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``ReqToTokenPool.alloc``: each admitted request's row, for role lookups."""
    state = _ACTIVE
    if state is not None and state.requests is not None:
        state.requests.on_alloc(result, req_pool, reqs)
    return result


def check_full_pool(original: Any, checker: Any, pool_stats: Any, uncached: int = 0) -> tuple[bool, str]:
    """AROUND hook of the scheduler's idle leak check: virtual ids, then every group's slots."""
    allocator = checker.token_to_kv_pool_allocator
    if not isinstance(allocator, LayerGroupAllocator):
        return original(checker, pool_stats, uncached)
    leak, message = checker._check_pool_invariant(
        "full (virtual ids)",
        allocator.virtual_available_size(),
        pool_stats.full_evictable_size,
        checker.tree_cache.protected_size(),
        checker.pool_stats_observer.session_held_tokens(),
        checker.max_total_num_tokens,
        uncached,
    )
    problems = allocator.check_slots()
    return leak or bool(problems), "; ".join([message, *problems])
