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
_UPDATE_META_INFO = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"


def register(config: PaskConfig) -> None:
    """Register every hook for ``config``; SGLang's load_plugins() applies them afterwards."""
    from sglang_pask.srt.role_grammar import RoleTrackingGrammarBackend
    from sglang_pask.srt.role_output import (
        RoleReportingOutputStreamer,
        contract_error_with_role_flag,
        drop_absent_role_fields,
        sampling_params_with_role_flag,
    )

    HookRegistry.register(_INTERNAL_STATE, _report_config(config), HookType.AFTER)
    # Structural roles (scheduler): every xgrammar grammar keeps a role track of its request.
    HookRegistry.register(_XGRAMMAR_BACKEND, RoleTrackingGrammarBackend, HookType.REPLACE)
    HookRegistry.register(_OUTPUT_STREAMER_CLASS, lambda result, *a, **k: RoleReportingOutputStreamer, HookType.AFTER)
    # return_kv_roles (tokenizer manager): accept the sampling parameter, report only when asked.
    HookRegistry.register(_GENERATE_CONTRACT, contract_error_with_role_flag, HookType.AROUND)
    HookRegistry.register(_TOKENIZER_MANAGER_INIT, _accept_role_flag(sampling_params_with_role_flag), HookType.AFTER)
    HookRegistry.register(_UPDATE_META_INFO, drop_absent_role_fields, HookType.AROUND)


def _report_config(config: PaskConfig):
    """AFTER hook: the scheduler's internal state (``/server_info`` -> ``internal_states``) carries
    the sglang-pask config as the scheduler process itself sees it, with that process's pid."""

    def add_config(result: Any, *args: Any, **kwargs: Any) -> Any:
        result.internal_state["sglang_pask"] = {**config.to_dict(), "pid": os.getpid()}
        return result

    return add_config


def _accept_role_flag(factory):
    """AFTER hook of ``TokenizerManager.__init__``: its sampling-params class accepts return_kv_roles."""

    def install(result: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
        manager.sampling_params_class = factory
        return result

    return install
