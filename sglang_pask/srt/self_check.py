"""Start-up self-check in every SGLang process: every hook sglang-pask registered must be applied.

SGLang's ``load_plugins()`` logs and goes on when a plugin raises, and ``HookRegistry.apply_hooks()``
logs and goes on when a target cannot be patched (a renamed class or method after an SGLang
upgrade). Either would leave a server running with a piece of sglang-pask silently off: the leak
check, kv_stats, admission, or the attention backend that reads the layer groups. So the plugin
records the targets it registers, and SGLang's ``apply_hooks`` (which ``load_plugins()`` calls after
every plugin ran) is wrapped in this process to compare them with ``HookRegistry._patched`` once it
has run. On any difference, or if registering failed, the process stops (``SystemExit``, which
SGLang's ``except Exception`` does not swallow) with one message naming each missing target.
Otherwise it prints one line: ``sglang-pask: N hooks applied (<process>)``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable

from sglang.srt.plugins.hook_registry import HookRegistry


def registered_targets(register: Callable[[], None]) -> list[str]:
    """Run ``register`` and return the targets it added hooks to (in registration order).

    Raises
    ------
    SystemExit
        If ``register`` raises: the message names the error.
    """
    before = {target: len(hooks) for target, hooks in HookRegistry._hooks.items()}
    try:
        register()
    except Exception as err:  # noqa: BLE001 (SGLang would log it and serve without the hooks)
        raise SystemExit(f"sglang-pask: could not register its hooks in SGLang ({type(err).__name__}: {err})") from err
    return [target for target, hooks in HookRegistry._hooks.items() if len(hooks) > before.get(target, 0)]


def check_after_apply(targets: list[str]) -> None:
    """Make SGLang's ``HookRegistry.apply_hooks`` run :func:`check_applied` on ``targets`` after it
    applied the hooks (every later call too; applying is idempotent)."""
    apply = HookRegistry.apply_hooks.__func__

    def apply_then_check(cls: type) -> None:
        apply(cls)
        check_applied(targets)

    HookRegistry.apply_hooks = classmethod(apply_then_check)


def check_applied(targets: list[str]) -> None:
    """Stop unless every one of ``targets`` was patched; print one line per process when all were."""
    missing = [target for target in targets if target not in HookRegistry._patched]
    if missing:
        raise SystemExit(
            f"sglang-pask: SGLang could not apply {len(missing)} of its {len(targets)} hooks (the installed SGLang "
            f"differs from the pinned one, or a target moved): {', '.join(missing)}"
        )
    print(f"sglang-pask: {len(targets)} hooks applied ({process_name()})", file=sys.stderr, flush=True)


def process_name() -> str:
    """This process as the log names it: SGLang's process title where it set one (``sglang::scheduler``),
    else its multiprocessing name; and its pid."""
    try:
        from setproctitle import getproctitle

        title = getproctitle()
    except ImportError:
        title = ""
    name = title if title.startswith("sglang::") else multiprocessing.current_process().name
    return f"{name}, pid {os.getpid()}"
