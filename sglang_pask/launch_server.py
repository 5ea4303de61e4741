"""``python -m sglang_pask.launch_server``: SGLang's server with sglang-pask's flags and defaults.

Every SGLang server flag is accepted unchanged; this project's flags (``--kv-policy``,
``--kv-budget``, ``--kv-layer-groups``, ``--structkv*``, ...) are parsed into one validated :class:`PaskConfig` first, so a
bad value exits with status 2 and a one-line message naming the flag before any model loads.
Then, where the user did not decide otherwise:

* no ``--model-path``: the embedded default model is prepared (first use) and served, with SGLang's
  ``qwen25`` tool-call parser so OpenAI ``tools`` requests return ``tool_calls``;
* no GPU: the CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``, torch_native attention,
  CUDA graphs off, a KV pool sized for a CPU machine, float32 on a CPU without native bf16);
* an attention backend that reads the layer groups' KV: torch_native or triton (the default on a
  GPU, with CUDA graphs off); any other is refused
  (:func:`sglang_pask.config_rules.attention_backend_flags`);
* the config is published in the environment for the plugin in every spawned SGLang process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Optional

from sglang_pask.config import ConfigError, PaskConfig, add_cli_args, from_namespace
from sglang_pask.config_rules import (
    attention_backend_flags,
    check_kv_cache_dtype,
    check_kv_plan,
    check_parallelism,
    check_sglang_version,
    check_tokenizer_workers,
    structkv_prefill_flags,
)
from sglang_pask.kv_bytes import kv_itemsize, resolve_kv_bytes
from sglang_pask.sglang_argv import PARALLEL_SIZE_FLAGS, flag_value, has_flag, parallel_size

PROG = "python -m sglang_pask.launch_server"

# CPU engine defaults, each applied only when the user did not pass that flag.
CPU_DEFAULTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--device", ("--device", "cpu")),
    ("--attention-backend", ("--attention-backend", "torch_native")),
    ("--disable-cuda-graph", ("--disable-cuda-graph",)),
    # SGLang sizes the KV pool as a fraction of "device memory"; on CPU that is host RAM, and its
    # default would take most of it. 2**17 token slots are ~1.5 GiB for the default model.
    ("--max-total-tokens", ("--max-total-tokens", "131072")),
    # An idle SGLang scheduler polls its sockets in a busy loop: on the CPU engine that kept both
    # cores of a 2-core machine at 199% with no request in flight (measured with `top`), slowing
    # everything else on the host, other servers included. It then waits on the sockets instead.
    ("--sleep-on-idle", ("--sleep-on-idle",)),
)


# CPU flags (/proc/cpuinfo) of native bf16 matrix instructions. Without either, torch 2.13's bf16
# GEMMs run far slower than fp32 ones: on a 2-core AMD EPYC with AVX2 only, a 2K-token prefill of the
# default model took 94.7 s in bf16 and 17.9 s in float32 (bench/results/cpu_dtype_2026-12-03.md).
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


def cpu_has_native_bf16(cpuinfo: Optional[str] = None) -> bool:
    """Whether the CPU lists one of :data:`NATIVE_BF16_CPU_FLAGS` in ``cpuinfo`` (the text of
    ``/proc/cpuinfo`` when None). True where the flags cannot be read (not Linux): then nothing is
    assumed and SGLang's own dtype choice stands."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return True
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    return flags is None or not NATIVE_BF16_CPU_FLAGS.isdisjoint(flags)


# SGLang's CPU engine binds each rank's OpenMP threads to one NUMA node, and refuses more ranks than
# nodes unless this variable names each rank's cores ("0-7|8-15").
CPU_THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
NUMA_NODES = Path("/sys/devices/system/node")


def cpu_rank_binding(ranks: int, cpus: list[int]) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` giving each of ``ranks`` ranks an equal contiguous share of
    ``cpus`` (the extra cores, if any, go to the first ranks), e.g. ``"0|1"`` or ``"0-3|4-7"``.

    Raises
    ------
    ConfigError
        If there are fewer CPUs than ranks.
    """
    if len(cpus) < ranks:
        raise ConfigError(
            f"{ranks} ranks (--tp-size x --dp-size x --pp-size) need at least one CPU core each; this host "
            f"lets the server use {len(cpus)}"
        )
    share, extra = divmod(len(cpus), ranks)
    parts, start = [], 0
    for rank in range(ranks):
        count = share + (1 if rank < extra else 0)
        chunk = sorted(cpus)[start : start + count]
        contiguous = chunk[-1] - chunk[0] == count - 1
        parts.append(f"{chunk[0]}-{chunk[-1]}" if contiguous and count > 1 else ",".join(map(str, chunk)))
        start += count
    return "|".join(parts)


def _cpu_ranks(sglang_argv: list[str]) -> int:
    """Scheduler ranks the CPU engine starts: --tp-size x --dp-size x --pp-size."""
    ranks = 1
    for names in PARALLEL_SIZE_FLAGS:
        ranks *= parallel_size(sglang_argv, names)
    return ranks


def _numa_nodes() -> int:
    nodes = [p for p in NUMA_NODES.glob("node[0-9]*")] if NUMA_NODES.is_dir() else []
    return max(1, len(nodes))


def cpu_defaults() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """:data:`CPU_DEFAULTS`, plus ``--dtype float32`` on a CPU without native bf16
    (:func:`cpu_has_native_bf16`), where a bf16 model would otherwise run several times slower."""
    if cpu_has_native_bf16():
        return CPU_DEFAULTS
    return CPU_DEFAULTS + (("--dtype", ("--dtype", "float32")),)


# --mem-fraction-static on CPU with chunked prefill off (always so under StructKV); see prepare().
CPU_UNCHUNKED_MEM_FRACTION = "0.5"


# The default model (Qwen2.5) writes tool calls as <tool_call>{...}</tool_call>; SGLang's qwen25 parser
# turns them into OpenAI `tool_calls`.
DEFAULT_MODEL_TOOL_PARSER = "qwen25"
# --strict-tools: SGLang's own switch that constrains every tool's arguments by its schema
# (ToolStrictLevel.PARAMETER), read by the OpenAI server in the launcher's process.
TOOL_STRICT_LEVEL_ENV = "SGLANG_TOOL_STRICT_LEVEL"
TOOL_STRICT_PARAMETERS = "2"


class _OwnFlagParser(argparse.ArgumentParser):
    """Parses only this project's flags; errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def split_argv(argv: list[str]) -> tuple[PaskConfig, list[str]]:
    """Separate this project's flags from SGLang's and validate them into a PaskConfig.

    Exits with status 2 and a one-line message naming the flag if a value is invalid.
    """
    parser = _OwnFlagParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_cli_args(parser)
    args, sglang_argv = parser.parse_known_args(argv)
    try:
        return from_namespace(args), sglang_argv
    except ConfigError as err:
        _fail(str(err))


def installed_sglang() -> Optional[str]:
    """The installed sglang distribution's version, None without one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _model_config(model_path: str) -> Optional[dict]:
    """A local model folder's config.json (its text part); None for non-local paths."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    return config.get("text_config", config)


def _gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def prepare(argv: list[str]) -> tuple[PaskConfig, list[str]]:
    """Everything before SGLang parses its flags: validation, device and model defaults, publishing.

    Returns the config and the argv to hand to SGLang.
    """
    config, sglang_argv = split_argv(argv)
    try:
        check_sglang_version(installed_sglang(), os.environ)
        sglang_argv += structkv_prefill_flags(config, sglang_argv)
        check_kv_cache_dtype(sglang_argv)
        check_tokenizer_workers(sglang_argv)
        check_parallelism(config, sglang_argv)
    except ConfigError as err:
        _fail(str(err))
    gpu = _gpu_available()
    if not gpu:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        for flag, defaults in cpu_defaults():
            if not has_flag(sglang_argv, flag):
                sglang_argv += list(defaults)
        ranks = _cpu_ranks(sglang_argv)
        if ranks > _numa_nodes() and CPU_THREADS_BIND_ENV not in os.environ:
            try:
                os.environ[CPU_THREADS_BIND_ENV] = cpu_rank_binding(ranks, sorted(os.sched_getaffinity(0)))
            except ConfigError as err:
                _fail(str(err))
        unchunked = (flag_value(sglang_argv, "--chunked-prefill-size") or "").strip() == "-1"
        if unchunked and not has_flag(sglang_argv, "--mem-fraction-static"):
            # Without chunked prefill SGLang reserves activation memory for --max-prefill-tokens
            # (16K tokens x 1.5 MB by default), more than a CPU host has; the KV pool's size is
            # --max-total-tokens here anyway.
            sglang_argv += ["--mem-fraction-static", CPU_UNCHUNKED_MEM_FRACTION]
    try:
        sglang_argv += attention_backend_flags(config, sglang_argv, gpu)
    except ConfigError as err:
        _fail(str(err))
    model_path = flag_value(sglang_argv, "--model-path") or flag_value(sglang_argv, "--model")
    if model_path is None:
        from sglang_pask.default_model import DefaultModelError, ensure_default_model

        try:
            model_path = str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
        except DefaultModelError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            raise SystemExit(1) from None
        sglang_argv += ["--model-path", model_path]
        if not has_flag(sglang_argv, "--tool-call-parser"):
            sglang_argv += ["--tool-call-parser", DEFAULT_MODEL_TOOL_PARSER]
    model_config = _model_config(model_path)
    if config.kv_bytes is not None:
        if has_flag(argv, "--kv-budget"):
            _fail("--kv-bytes sets --kv-budget: give one of the two")
        try:
            config = resolve_kv_bytes(config, kv_itemsize(sglang_argv, model_config), Path(model_path).name)
        except ConfigError as err:
            _fail(str(err))
    if model_config is not None and model_config.get("num_hidden_layers") is not None:
        context_len = flag_value(sglang_argv, "--context-length") or model_config.get("max_position_embeddings")
        try:
            check_kv_plan(
                config, int(model_config["num_hidden_layers"]), int(context_len or 2**31), Path(model_path).name
            )
        except ConfigError as err:
            _fail(str(err))
    if config.strict_tools:
        os.environ[TOOL_STRICT_LEVEL_ENV] = TOOL_STRICT_PARAMETERS
    config.publish()
    return config, sglang_argv


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        from sglang_pask.srt.server import print_help

        print_help(PROG, add_cli_args)
        return
    _, sglang_argv = prepare(argv)
    from sglang_pask.srt.server import serve

    serve(sglang_argv)


if __name__ == "__main__":
    main()
