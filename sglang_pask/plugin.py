"""Entry point of the ``sglang.srt.plugins`` group: activates sglang-pask inside each SGLang process.

SGLang calls :func:`activate` from ``load_plugins()`` in the launcher, the scheduler (a spawned
process, so launcher-side monkeypatches would not reach it), the detokenizer and the DP controller.
Without a published config (SGLang started by ``sglang serve``, not by ``sglang_pask.launch_server``)
it does nothing, so a plain SGLang server in the same environment stays stock SGLang.
"""

from __future__ import annotations

from sglang_pask.config import PaskConfig


def activate() -> None:
    """Register sglang-pask's hooks if the launcher published a config, else do nothing."""
    config = PaskConfig.from_env()
    if config is None:
        return
    from sglang_pask.srt import hooks

    hooks.register(config)
