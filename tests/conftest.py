"""Shared fixtures: the toy tokenizer with its vocabulary and xgrammar compiler, the tiny random-weight
model, and real servers started once per test session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import build_tiny_model  # noqa: E402

from sglang_pask.server_process import ServerProcess  # noqa: E402
from sglang_pask.structure.toy_tokenizer import build_toy_tokenizer  # noqa: E402
from sglang_pask.structure.vocab import TokenVocab  # noqa: E402

# Flags of the shared tiny-model server; tests read them back through /server_info.
TINY_SERVER_FLAGS = ["--kv-policy", "full", "--kv-budget", "1.0", "--kv-layer-groups", "0-0,1-1"]
# SGLang flags both tiny servers share (a random model favours whitespace, which JSON grammars
# allow without limit).
TINY_SGLANG_FLAGS = ["--constrained-json-disable-any-whitespace"]


@pytest.fixture(scope="session")
def tok() -> Any:
    """The toy byte-level BPE tokenizer (4096 tokens, trained on the Python standard library)."""
    return build_toy_tokenizer()


@pytest.fixture(scope="session")
def vocab(tok: Any) -> TokenVocab:
    return TokenVocab.from_huggingface(tok)


@pytest.fixture(scope="session")
def compiler(tok: Any) -> Any:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    return xgrammar.GrammarCompiler(info, max_threads=1)


@pytest.fixture(scope="session")
def tiny_server_flags() -> list[str]:
    """The sglang-pask flags the shared tiny-model server was started with."""
    return list(TINY_SERVER_FLAGS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny Qwen3 model folder (tokenizer + random bf16 weights)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m sglang_pask.launch_server`` on the tiny model (CPU engine chosen by the launcher)."""
    log = tmp_path_factory.mktemp("logs") / "tiny_server.log"
    server = ServerProcess(["--model-path", str(tiny_model_dir), *TINY_SGLANG_FLAGS, *TINY_SERVER_FLAGS], log)
    try:
        yield server.wait_ready(timeout_s=300)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def stock_tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Stock SGLang (``python -m sglang.launch_server``, sglang-pask's plugin inactive) on the tiny
    model with the CPU settings the launcher picks, for output-identity comparisons."""
    from sglang_pask.config import CONFIG_ENV
    from sglang_pask.launch_server import cpu_defaults

    cpu_flags = [arg for _, flags in cpu_defaults() for arg in flags]
    log = tmp_path_factory.mktemp("logs") / "stock_tiny_server.log"
    server = ServerProcess(
        ["--model-path", str(tiny_model_dir), *cpu_flags, *TINY_SGLANG_FLAGS],
        log,
        env={"SGLANG_USE_CPU_ENGINE": "1", CONFIG_ENV: None},
        module="sglang.launch_server",
    )
    try:
        yield server.wait_ready(timeout_s=300)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def default_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The launcher with no --model-path: serves the embedded default model (prepared on first use)."""
    log = tmp_path_factory.mktemp("logs") / "default_model_server.log"
    server = ServerProcess([], log)
    try:
        yield server.wait_ready(timeout_s=900)
    finally:
        server.stop()
