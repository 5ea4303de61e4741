"""The scheduler's idle leak check over the layer-group pool (a hook of SGLang's invariant checker).

``SchedulerInvariantChecker._check_full_pool`` (AROUND): with a
:class:`~sglang_pask.srt.pool.LayerGroupAllocator`, the check counts the virtual ids as SGLang counts
its token slots, then checks every group's slot conservation
(:meth:`~sglang_pask.srt.pool.LayerGroupAllocator.check_slots`).
"""

from __future__ import annotations

from typing import Any

from sglang_pask.srt.pool import LayerGroupAllocator


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
