"""Entry point of the ``sglang.srt.plugins`` group: activates sglang-pask inside each SGLang process.

SGLang calls :func:`activate` from ``load_plugins()`` in the launcher, the scheduler (a spawned
process, so launcher-side monkeypatches would not reach it), the detokenizer and the DP controller.
Without a published config (SGLang started by ``sglang serve``, not by ``sglang_pask.launch_server``)
it does nothing, so a plain SGLang server in the same environment stays stock SGLang. With one, every
hook must apply, or the process stops naming what is missing (:mod:`sglang_pask.srt.self_check`).
"""

from __future__ import annotations

from sglang_pask.config import PaskConfig


def activate() -> None:
    """Register sglang-pask's hooks if the launcher published a config, else do nothing; the process
    stops if registering fails or, once SGLang applied the hooks, any of them did not apply."""
    config = PaskConfig.from_env()
    if config is None:
        return
    from sglang_pask.srt import self_check

    def register() -> None:
        from sglang_pask.srt import hooks

        hooks.register(config)

    self_check.check_after_apply(self_check.registered_targets(register))
