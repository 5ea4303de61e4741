"""Hooks that sglang-pask registers inside every SGLang process through SGLang's HookRegistry."""

from __future__ import annotations

import os
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_pask.config import PaskConfig

_INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state"
)
_XGRAMMAR_BACKEND = "sglang.srt.constrained.xgrammar_backend.XGrammarGrammarBackend"
_OUTPUT_STREAMER_CLASS = "sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class"
_TOKENIZER_MANAGER_INIT = "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__"
_GENERATE_CONTRACT = "sglang.srt.entrypoints.api_contract.generate_contract_error"
_VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
_UPDATE_META_INFO = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
_CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
_REQ_TO_TOKEN_POOL = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"
_INVARIANT_CHECKER = "sglang.srt.managers.scheduler_components.invariant_checker.SchedulerInvariantChecker"
_METRICS_COLLECTOR = "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector"
_PREFILL_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
_TORCH_NATIVE_BACKEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
_TRITON_BACKEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
_SET_GLOBAL_STATE = "sglang.srt.entrypoints.http_server.set_global_state"
_MODEL_RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
_POOL_STATS = "sglang.srt.managers.scheduler_components.pool_stats_observer.SchedulerPoolStatsObserver._get_token_info"


def register(config: PaskConfig) -> None:
    """Register every hook for ``config``; SGLang's load_plugins() applies them afterwards."""
    from sglang_pask.api.kv_stats import KV_STATS_KEY
    from sglang_pask.srt import configurator, metrics, rows
    from sglang_pask.srt.admission import reserve_running_requests
    from sglang_pask.srt.attention.torch_native import LayerGroupTorchNativeAttnBackend
    from sglang_pask.srt.attention.triton import LayerGroupTritonAttnBackend
    from sglang_pask.srt.contract import contract_error, reject_unservable_prompt, sampling_params_with_flags
    from sglang_pask.srt.grammar import RoleTrackingGrammarBackend
    from sglang_pask.srt.http_errors import install_validation_handler
    from sglang_pask.srt.leak_check import check_full_pool
    from sglang_pask.srt.output import ROLE_KEYS, PaskOutputStreamer, drop_absent_fields

    HookRegistry.register(_INTERNAL_STATE, _report_state(config), HookType.AFTER)
    # Structural roles (scheduler): every xgrammar grammar keeps a role track of its request.
    HookRegistry.register(_XGRAMMAR_BACKEND, RoleTrackingGrammarBackend, HookType.REPLACE)
    # Responses: kv_roles / kv_prompt_roles when asked, kv_stats always.
    HookRegistry.register(_OUTPUT_STREAMER_CLASS, lambda result, *a, **k: PaskOutputStreamer, HookType.AFTER)
    # return_kv_roles, return_kv_kept (tokenizer manager): accept the sampling parameters, report
    # only when asked; calibration probes are checked there too.
    HookRegistry.register(_GENERATE_CONTRACT, contract_error, HookType.AROUND)
    # Prompts the engine would die on (tokenizer manager): HTTP 400 instead.
    HookRegistry.register(_VALIDATE_REQUEST, reject_unservable_prompt, HookType.BEFORE)
    HookRegistry.register(_TOKENIZER_MANAGER_INIT, _accept_flags(sampling_params_with_flags), HookType.AFTER)
    # Bodies FastAPI cannot parse (HTTP server): the message names the problem, not the server's code.
    HookRegistry.register(_SET_GLOBAL_STATE, install_validation_handler, HookType.AFTER)
    HookRegistry.register(
        _UPDATE_META_INFO, drop_absent_fields(ROLE_KEYS + (KV_STATS_KEY,), (KV_STATS_KEY,)), HookType.AROUND
    )
    # Layer-group KV pool (scheduler): pool, allocator, views, attention, leak check.
    HookRegistry.register(_CONFIGURATOR + "._build_mha_kv_pool", configurator.pool_builder(config), HookType.AROUND)
    HookRegistry.register(
        _CONFIGURATOR + "._build_token_to_kv_pool_allocator", configurator.build_allocator, HookType.AROUND
    )
    HookRegistry.register(_CONFIGURATOR + ".configure", configurator.virtual_capacity, HookType.AFTER)
    HookRegistry.register(_REQ_TO_TOKEN_POOL + ".free", rows.release_request, HookType.AROUND)
    HookRegistry.register(_REQ_TO_TOKEN_POOL + ".free_rows", rows.release_rows, HookType.AROUND)
    HookRegistry.register(_REQ_TO_TOKEN_POOL + ".alloc", rows.remember_rows, HookType.AFTER)
    HookRegistry.register(_INVARIANT_CHECKER + "._check_full_pool", check_full_pool, HookType.AROUND)
    HookRegistry.register(_TORCH_NATIVE_BACKEND, LayerGroupTorchNativeAttnBackend, HookType.REPLACE)
    HookRegistry.register(_TRITON_BACKEND, LayerGroupTritonAttnBackend, HookType.REPLACE)
    # A decode step run from the triton backend's graph buffers keeps or packs after the forward.
    HookRegistry.register(_MODEL_RUNNER_FORWARD, _finish_graph_step, HookType.AFTER)
    HookRegistry.register(_PREFILL_ADDER + ".__init__", reserve_running_requests, HookType.AFTER)
    # StructKV (scheduler): the layer loop of Qwen2, Qwen3 and Llama models prunes the prefill.
    if config.structkv:
        from sglang_pask.srt.model_loop import MODEL_FORWARDS, structkv_forward
        from sglang_pask.structkv.forward_pass import StructKVSettings

        settings = StructKVSettings.from_flags(
            config.structkv_mode,
            config.structkv_pivot,
            config.structkv_prefill_ratio,
            config.structkv_kv_ratio,
            config.kv_window,
            config.structkv_window,
            config.structkv_select,
            config.structkv_kv_score,
            config.structkv_min_prompt,
        )
        for target in MODEL_FORWARDS:
            HookRegistry.register(target, structkv_forward(settings), HookType.AROUND)
    # Prometheus (--enable-metrics): the pool's gauges beside SGLang's.
    HookRegistry.register(_METRICS_COLLECTOR + ".__init__", metrics.create_gauges, HookType.AFTER)
    HookRegistry.register(_METRICS_COLLECTOR + ".log_stats", metrics.update_gauges, HookType.AFTER)
    # SGLang's token usage (log, sglang:token_usage): the pool's own (metrics.report_pool_usage).
    HookRegistry.register(_POOL_STATS, metrics.report_pool_usage, HookType.AFTER)


def _report_state(config: PaskConfig):
    """AFTER hook: the scheduler's internal state (``/server_info`` -> ``internal_states``) carries
    the sglang-pask config as the scheduler process itself sees it, with that process's pid, and the
    layer-group pool's usage (``kv_pool``: slots and bytes in use per group, full-KV equivalent).
    Under tensor parallelism ``tp_ranks`` holds each rank's ``kv_pool`` and ``held`` (per group, a
    hash of the tokens it holds at full precision), gathered from every rank."""
    from sglang_pask.srt.active_pool import active
    from sglang_pask.srt.tensor_parallel import gather_rank_reports

    def add_state(result: Any, *args: Any, **kwargs: Any) -> Any:
        state = {**config.to_dict(), "pid": os.getpid()}
        pool = active()
        if pool is not None and pool.allocator is not None:
            state["kv_pool"] = pool.usage()
            ranks = gather_rank_reports({"kv_pool": state["kv_pool"], "held": pool.held_digests()})
            if ranks is not None:
                state["tp_ranks"] = ranks
        result.internal_state["sglang_pask"] = state
        return result

    return add_state


def _finish_graph_step(result: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``ModelRunner.forward``: the layer groups of a decode step that ran from the
    graph buffers (a replayed CUDA graph) keep, compress or pack now
    (:meth:`~sglang_pask.srt.attention.triton.LayerGroupTritonAttnBackend.finish_graph_step`)."""
    finish = getattr(runner.attn_backend, "finish_graph_step", None)
    if finish is not None:
        finish()
    return result


def _accept_flags(factory):
    """AFTER hook of ``TokenizerManager.__init__``: its sampling-params class accepts return_kv_roles
    and return_kv_kept."""

    def install(result: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
        manager.sampling_params_class = factory
        return result

    return install
