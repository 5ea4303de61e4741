"""The scheduler process's layer-group pool: its parts, its configuration and its usage.

One scheduler process holds one pool. :mod:`.configurator` builds it (:func:`set_active`) when
SGLang builds its KV cache, and every other part of the seam finds it with :func:`active`: the
request-row hooks (:mod:`.rows`), ``/server_info`` (:mod:`.hooks`) and the Prometheus gauges
(:mod:`.metrics`) read :meth:`ActivePool.usage`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import torch

from sglang_pask.config import KV_DROPPED_BITS, PaskConfig
from sglang_pask.kvpool.compression import KVViewTable
from sglang_pask.kvpool.lowbit import BlockFormat, LowBitStore
from sglang_pask.kvpool.views import RequestView
from sglang_pask.policy import KVPolicy
from sglang_pask.srt.pool import LayerGroupAllocator, LayerGroupMHAKVPool
from sglang_pask.srt.roles import RequestRoles


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
        """``(num_groups,)`` each group's share of full KV's slots per request (:func:`storage_budgets`)."""
        return storage_budgets(self.config, self.policy, self.budgets, self.pool.store_dtype.itemsize)

    def held_positions(self, row: int, request: RequestView, req_to_token: torch.Tensor) -> list[torch.Tensor]:
        """``(num_groups,)`` of ``(k_g,)`` int64 ascending, on the pool's device: the positions each
        group read for the request at its last step that the pool still holds (a shared prefix may
        lack tokens that an earlier request dropped). Copied to the host only if a request asks."""
        held = []
        for group, view in enumerate(request.groups):
            positions = view.positions(request.seq_len, req_to_token.device)
            held.append(positions[self.pool.physical(group, req_to_token[row, positions]) > 0])
        return held

    def held_digests(self) -> list[str]:
        """``(num_groups,)`` a short hash of the virtual ids each group holds at full precision: equal
        on two ranks (or servers) exactly when they hold the same tokens."""
        digests = []
        for group in range(self.pool.layout.num_groups):
            held = torch.nonzero(self.pool.group_loc[group] > 0).flatten().to(torch.int64).cpu()
            digests.append(hashlib.sha1(held.numpy().tobytes()).hexdigest()[:16])
        return digests

    def token_usage(self) -> float:
        """The fullest layer group's share of its slots in use (tokens the radix cache holds included),
        in [0, 1]: what runs out first, so what SGLang's ``token usage`` reports for this pool."""
        assert self.allocator is not None
        slots = self.pool.layout.group_slots
        return max(self.allocator.group_used_slots(g) / slots[g] for g in range(len(slots)))

    def usage(self) -> dict[str, Any]:
        """Pool usage now (and peaks since start): :meth:`token_usage`, requests holding KV, per group
        slots and bytes in use, and the full-KV equivalent of the tokens held."""
        assert self.allocator is not None
        layout = self.pool.layout
        groups = []
        for g, layers in enumerate(layout.ranges):
            used = self.allocator.group_used_slots(g)
            groups.append(
                {
                    "layers": f"{layers[0]}-{layers[-1]}",
                    "budget": self.budgets[g],
                    "slots_in_use": used,
                    "lowbit_slots_in_use": 0 if self.lowbit is None else int(self.lowbit.held_slots(g).numel()),
                    "peak_slots_in_use": self.allocator.peak_group_used[g],
                    "slots": layout.group_slots[g],
                    "bytes_per_slot": self.pool.bytes_per_slot(g),
                    "bytes_in_use": used * self.pool.bytes_per_slot(g),
                    "bytes": self.pool.group_buffer_bytes(g),
                }
            )
        tokens = layout.virtual_slots - self.allocator.virtual_available_size()
        full_bytes_per_token = sum(self.pool.bytes_per_slot(g) for g in range(layout.num_groups))
        assert self.views is not None
        return {
            "token_usage": self.token_usage(),
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


def set_active(state: ActivePool) -> None:
    """This process's layer-group pool, as SGLang built it."""
    global _ACTIVE
    _ACTIVE = state


def storage_budgets(config: PaskConfig, policy: KVPolicy, budgets: list[float], itemsize: int) -> list[float]:
    """``(num_groups,)`` each group's share of full KV's slots per request: its budget, or under a
    low-bit ``--kv-dropped`` mode its budget plus the blocks of the tokens it stores at low bits (all
    the rest, or a tiered policy's expected share, :meth:`~sglang_pask.policy.base.KVPolicy.lowbit_shares`;
    :meth:`~sglang_pask.kvpool.lowbit.BlockFormat.storage_budget`). The pool's layout splits its memory
    between the groups and the virtual ids by these shares; admission counts each group's real free
    slots, so a request that stores more than the expected share is never admitted beyond them."""
    block_format = lowbit_format(config)
    if block_format is None:
        return list(budgets)
    shares = policy.lowbit_shares(len(budgets)) or [None] * len(budgets)
    return [block_format.storage_budget(b, itemsize, share) for b, share in zip(budgets, shares)]
