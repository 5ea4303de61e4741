"""Prometheus gauges of the layer-group pool, next to SGLang's own (``--enable-metrics``).

* ``sglang_pask:kv_pool_slots_in_use{group=...}`` and ``sglang_pask:kv_pool_bytes_in_use{group=...}``:
  what each layer group's pool holds;
* ``sglang_pask:kv_pool_full_equivalent_bytes``: what full KV of the tokens held would take;
* ``sglang_pask:kv_pool_running_requests``: requests holding KV in the pool.

Created with SGLang's scheduler metrics collector (same labels, same multiprocess registry) and set
whenever it logs its own stats.

SGLang's own ``token usage`` (its log lines, ``sglang:token_usage``) comes from the scheduler's pool
stats, which count free virtual ids against the per-group slots and read about 0.87 on an idle
compressed server; :func:`report_pool_usage` makes them the pool's own usage
(:meth:`~sglang_pask.srt.active_pool.ActivePool.token_usage`, also in ``/server_info``'s
``kv_pool``).
"""

from __future__ import annotations

from typing import Any

from sglang_pask.srt.active_pool import active

_GAUGES = "_sglang_pask_gauges"


def create_gauges(result: Any, collector: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``SchedulerMetricsCollector.__init__``."""
    from prometheus_client import Gauge

    labels = list(collector.labels.keys())
    setattr(
        collector,
        _GAUGES,
        {
            "slots": Gauge(
                "sglang_pask:kv_pool_slots_in_use",
                "Slots in use in a layer group's KV pool.",
                labelnames=[*labels, "group"],
                multiprocess_mode="mostrecent",
            ),
            "bytes": Gauge(
                "sglang_pask:kv_pool_bytes_in_use",
                "KV bytes in use in a layer group's pool.",
                labelnames=[*labels, "group"],
                multiprocess_mode="mostrecent",
            ),
            "full": Gauge(
                "sglang_pask:kv_pool_full_equivalent_bytes",
                "Bytes full KV of the tokens held in the pool would take.",
                labelnames=labels,
                multiprocess_mode="mostrecent",
            ),
            "running": Gauge(
                "sglang_pask:kv_pool_running_requests",
                "Requests holding KV in the pool.",
                labelnames=labels,
                multiprocess_mode="mostrecent",
            ),
        },
    )
    return result


def update_gauges(result: Any, collector: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``SchedulerMetricsCollector.log_stats``: set the gauges from the pool."""
    gauges = getattr(collector, _GAUGES, None)
    state = active()
    if gauges is None or state is None or state.allocator is None:
        return result
    usage = state.usage()
    for group in usage["groups"]:
        labels = {**collector.labels, "group": group["layers"]}
        gauges["slots"].labels(**labels).set(group["slots_in_use"])
        gauges["bytes"].labels(**labels).set(group["bytes_in_use"])
    gauges["full"].labels(**collector.labels).set(usage["full_equivalent_bytes"])
    gauges["running"].labels(**collector.labels).set(usage["running_requests"])
    return result


def report_pool_usage(result: Any, observer: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``SchedulerPoolStatsObserver._get_token_info``: on the layer-group pool, the tokens
    in use are the virtual ids held and the usage is the fullest group's share of its slots."""
    state = active()
    if state is None or state.allocator is None or observer.token_to_kv_pool_allocator is not state.allocator:
        return result
    result.full_num_used = state.pool.layout.virtual_slots - state.allocator.virtual_available_size()
    result.full_token_usage = state.token_usage()
    return result
