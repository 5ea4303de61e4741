"""The layer-group KV pool built where SGLang builds its KV cache (``KVCacheConfigurator``).

Hooks (registered by :mod:`.hooks`):

* ``KVCacheConfigurator._build_mha_kv_pool`` (AROUND): the policy's group budgets size each group's
  slots (:mod:`sglang_pask.kvpool.sizing`, same bytes as SGLang's pool), and SGLang builds its MHA
  pool as usual, of our class :class:`~sglang_pask.srt.pool.LayerGroupMHAKVPool` bound to that
  layout; it becomes this process's :class:`~.active_pool.ActivePool`.
* ``KVCacheConfigurator._build_token_to_kv_pool_allocator`` (AROUND): a
  :class:`~sglang_pask.srt.pool.LayerGroupAllocator` over ``V`` virtual ids and the request views
  (:class:`~sglang_pask.kvpool.compression.KVViewTable`) with the policy and its group budgets
  (under a low-bit ``--kv-dropped`` mode, with the :mod:`sglang_pask.kvpool.lowbit` block store).
* ``KVCacheConfigurator.configure`` (AFTER): the scheduler's token capacity becomes ``V``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import msgspec
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from sglang_pask.config import KV_DROPPED_BITS, PaskConfig
from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS
from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.kvpool.lowbit import BlockFormat, LowBitStore, requantize_in_place
from sglang_pask.kvpool.sizing import plan_layout
from sglang_pask.policy import plan_group_budgets
from sglang_pask.policy.resolve import build_policy
from sglang_pask.srt.active_pool import ActivePool, active, lowbit_format, set_active, storage_budgets
from sglang_pask.srt.pool import LayerGroupAllocator, LayerGroupMHAKVPool
from sglang_pask.srt.roles import RequestRoles
from sglang_pask.srt.tensor_parallel import score_reducer


def pool_builder(config: PaskConfig):
    """AROUND hook of ``KVCacheConfigurator._build_mha_kv_pool``: build our pool class."""

    def build(
        original: Any, configurator: Any, *, max_total_num_tokens: int, mha_pool_class: type, quant_method: Any = None
    ) -> Any:
        if configurator.is_draft_worker:
            return original(
                configurator,
                max_total_num_tokens=max_total_num_tokens,
                mha_pool_class=mha_pool_class,
                quant_method=quant_method,
            )
        if mha_pool_class is not MHATokenToKVPool or quant_method is not None:
            raise RuntimeError(
                f"sglang-pask layer groups need SGLang's plain MHA KV pool, but this server would use "
                f"{mha_pool_class.__name__}{' with a quantized KV cache' if quant_method is not None else ''}"
            )
        layers = configurator.layer_info
        if layers.start_layer != 0:
            raise RuntimeError(
                "sglang-pask layer groups do not support pipeline parallelism (the pool starts "
                f"at layer {layers.start_layer})"
            )
        num_layers = layers.num_effective_layers
        ranges = config.kv_layer_groups.resolve(num_layers)
        policy = build_policy(
            config.kv_policy,
            config.pask_policy,
            num_layers,
            ranges,
            Path(configurator.model_config.model_path).name,
            config.kv_decode,
            config.kv_policy_args,
            config.kv_dropped,
        )
        budgets = plan_group_budgets(
            policy, config.kv_budget, [len(r) for r in ranges], config.kv_window, configurator.model_config.context_len
        )
        itemsize = configurator.kv_cache_dtype.itemsize
        storage = storage_budgets(config, policy, budgets, itemsize)
        block_format = lowbit_format(config)
        block_rows = 0 if block_format is None else block_format.rows_per_block(itemsize)
        layout = plan_layout(
            max_total_num_tokens,
            ranges,
            storage,
            _prefill_chunk(),
            config.kv_window + policy.reserved_tokens + KVViewTable.DECODE_SLACK + block_rows,
        )
        pool = original(
            configurator,
            max_total_num_tokens=max_total_num_tokens,
            mha_pool_class=functools.partial(LayerGroupMHAKVPool, layout=layout),
            quant_method=None,
        )
        set_active(ActivePool(config=config, policy=policy, budgets=budgets, pool=pool))
        return pool

    return build


def _prefill_chunk() -> Optional[int]:
    """The server's ``--chunked-prefill-size`` (None when chunked prefill is off)."""
    from sglang.srt.runtime_context import get_schedule

    size = get_schedule().chunked_prefill_size
    return size if size is not None and size > 0 else None


def build_allocator(
    original: Any,
    configurator: Any,
    *,
    sizes: Any,
    token_to_kv_pool: Any,
    is_dsv4_model: bool,
    req_to_token_pool: Any,
    token_to_kv_pool_allocator: Any,
) -> Any:
    """AROUND hook of ``KVCacheConfigurator._build_token_to_kv_pool_allocator``."""
    state = active()
    if state is None or token_to_kv_pool is not state.pool:
        return original(
            configurator,
            sizes=sizes,
            token_to_kv_pool=token_to_kv_pool,
            is_dsv4_model=is_dsv4_model,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
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
        state.pool,
        configurator.kv_cache_dtype,
        configurator.device,
        need_sort=False,
        budgets=state.storage_budgets,
        growth_overhead=0 if min(state.budgets) >= 1.0 else overhead,
        prefill_chunk=_prefill_chunk(),
        compress_decode=state.config.kv_decode == "compress",
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

    def evict(row: int, group: int, positions: torch.Tensor) -> None:
        allocator.drop(group, req_to_token[row, positions])

    def requantize(row: int, group: int, positions: torch.Tensor, lowbit: str) -> None:
        physical = state.pool.physical(group, req_to_token[row, positions]).long()
        requantize_in_place(state.pool, group, physical[physical > 0], BlockFormat(*KV_DROPPED_BITS[lowbit]))

    def holds(row: int, group: int, positions: torch.Tensor) -> torch.Tensor:
        return state.pool.physical(group, req_to_token[row, positions]) > 0

    dropped_block = None
    if block_format is not None:
        dropped_block = (BLOCK_TOKENS, block_format.rows_per_block(state.pool.store_dtype.itemsize))
    state.allocator = allocator
    state.requests = RequestRoles()
    state.views = KVViewTable(
        state.policy,
        state.budgets,
        state.config.kv_window,
        drop,
        slack=slack,
        score_window=state.config.kv_score_window,
        compress_decode=state.config.kv_decode == "compress",
        device=req_to_token.device,
        roles_of=state.requests.roles_of,
        probe_of=state.requests.probe_of,
        holds=holds,
        dropped_block=dropped_block,
        decode_block=BLOCK_TOKENS if state.config.kv_decode == "lowbit" else None,
        reduce_scores=score_reducer(),
        evict=evict,
        requantize=requantize,
    )
    state.pool.views = state.views
    return allocator


def virtual_capacity(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``KVCacheConfigurator.configure``: the scheduler hands out ``V`` token ids."""
    state = active()
    if state is None or result.token_to_kv_pool is not state.pool:
        return result
    return msgspec.structs.replace(result, max_total_num_tokens=state.pool.layout.virtual_slots)
