"""Hooks that sglang-pask registers inside every SGLang process through SGLang's HookRegistry."""

from __future__ import annotations

import os
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_pask.config import PaskConfig

_INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state"
)


def register(config: PaskConfig) -> None:
    """Register every hook for ``config``; SGLang's load_plugins() applies them afterwards."""
    HookRegistry.register(_INTERNAL_STATE, _report_config(config), HookType.AFTER)


def _report_config(config: PaskConfig):
    """AFTER hook: the scheduler's internal state (``/server_info`` -> ``internal_states``) carries
    the sglang-pask config as the scheduler process itself sees it, with that process's pid."""

    def add_config(result: Any, *args: Any, **kwargs: Any) -> Any:
        result.internal_state["sglang_pask"] = {**config.to_dict(), "pid": os.getpid()}
        return result

    return add_config
