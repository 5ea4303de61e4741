"""Every rule that relates several flags, each with its message (a :class:`ConfigError` naming them).

- :func:`check_config`: rules among this project's flags, checked whenever a :class:`PaskConfig` is
  built (in the launcher and again in every SGLang process).
- :func:`check_kv_plan`: the flags against the served model (its layers, context length and, for
  ``pask``, its policy file), in the launcher before the model loads.
- :func:`structkv_prefill_flags`, :func:`attention_backend_flags`: the flags against SGLang's own,
  in the launcher; they return the SGLang flags this project needs added;
  :func:`check_kv_cache_dtype`: SGLang's quantized KV dtypes, refused;
- :func:`check_sglang_version`: the installed SGLang against the pinned one.

The rule a single flag's value must meet is in its row of the flag table (:mod:`sglang_pask.config`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

from sglang_pask.config import ConfigError, format_policy_args
from sglang_pask.sglang_argv import PARALLEL_SIZE_FLAGS, flag_value, has_flag, parallel_size

if TYPE_CHECKING:
    from sglang_pask.config import PaskConfig

#: The SGLang release sglang-pask's hooks are written against (pyproject's dependency; a test keeps the two
#: in step).
PINNED_SGLANG = "0.5.23"
#: Set to 1 to serve with another SGLang release anyway (the hook self-check still stops a process
#: whose hooks do not apply).
ALLOW_OTHER_SGLANG_ENV = "SGLANG_PASK_ALLOW_OTHER_SGLANG"

#: Attention backends whose reads go through each layer group's index lists.
LAYER_GROUP_BACKENDS = ("torch_native", "triton")
_BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
_LOWBIT_DROPPED = ("2bit", "k4v2")
#: SGLang's switch that captures the decode metadata preparation itself in a graph.
METADATA_GLUE_ENV = "SGLANG_ENABLE_METADATA_GLUE_GRAPH"


def check_config(config: "PaskConfig") -> None:
    """Raise ConfigError if this project's flags break a rule between them."""
    if config.pask_policy is not None and config.kv_policy != "pask":
        raise ConfigError(f"--pask-policy applies to --kv-policy pask only (the policy is {config.kv_policy!r})")
    if config.kv_decode == "lowbit" and config.kv_dropped not in _LOWBIT_DROPPED:
        raise ConfigError(
            f"--kv-decode lowbit stores generated tokens in low-bit blocks: it needs --kv-dropped "
            f"2bit or k4v2, got --kv-dropped {config.kv_dropped}"
        )
    if config.kv_bytes is not None:
        _check_kv_bytes(config)
    if config.kv_dropped != "drop":
        _check_lowbit_dropped(config)
    if config.structkv_mode != "structkv" and config.structkv_pivot == "auto":
        raise ConfigError(f"--structkv-mode {config.structkv_mode} needs a fixed --structkv-pivot N (a layer index)")
    if config.structkv and config.kv_window < 1:
        raise ConfigError("--kv-window: StructKV keeps a window of at least 1 token in every layer group's KV")
    if config.kv_policy_args:
        _check_policy_args(config)


def _check_kv_bytes(config: "PaskConfig") -> None:
    if config.kv_policy == "full":
        raise ConfigError("--kv-bytes: --kv-policy full keeps all of full KV's bytes; choose a compressing policy")
    if config.structkv:
        raise ConfigError("--kv-bytes: not supported with --structkv (StructKV sizes each group's KV itself)")


def _check_lowbit_dropped(config: "PaskConfig") -> None:
    dropped = config.kv_dropped
    if config.kv_policy == "full" or (config.kv_budget >= 1.0 and config.kv_bytes is None):
        raise ConfigError(
            f"--kv-dropped {dropped}: nothing is dropped with --kv-policy {config.kv_policy} "
            f"at --kv-budget {config.kv_budget:g}; choose a compressing policy and a budget below 1"
        )
    if config.kv_decode == "compress":
        raise ConfigError(
            f"--kv-dropped {dropped} needs --kv-decode keep or lowbit (a compressing decode "
            "step drops a few tokens at a time, too few to fill a low-bit block)"
        )
    if config.structkv:
        raise ConfigError(f"--kv-dropped {dropped}: not supported with --structkv")


def _check_policy_args(config: "PaskConfig") -> None:
    """``--kv-policy-args`` against the policy's own fields (imports the policies, hence torch)."""
    from sglang_pask.policy import policy_options

    try:
        policy_options(config.kv_policy, config.kv_policy_args)
    except ValueError as err:
        raise ConfigError(f"--kv-policy-args {format_policy_args(config.kv_policy_args)}: {err}") from None


def check_kv_plan(config: "PaskConfig", num_layers: int, context_len: int, model_name: str) -> None:
    """Check the layer groups, the policy (for pask its policy file) and every group's budget against
    the model, as the scheduler will apply them; raise ConfigError naming the flag and the numbers."""
    ranges = config.kv_layer_groups.resolve(num_layers)
    from sglang_pask.policy import PolicyFileError, plan_group_budgets
    from sglang_pask.policy.resolve import build_policy

    try:
        policy = build_policy(
            config.kv_policy,
            config.pask_policy,
            num_layers,
            ranges,
            model_name,
            config.kv_decode,
            config.kv_policy_args,
            config.kv_dropped,
        )
    except PolicyFileError as err:
        raise ConfigError(f"--pask-policy: {err}") from None
    try:
        plan_group_budgets(policy, config.kv_budget, [len(r) for r in ranges], config.kv_window, context_len)
    except ValueError as err:
        raise ConfigError(f"--kv-budget/--kv-window: {err}") from None
    if config.structkv and config.structkv_pivot != "auto" and not config.structkv_pivot < num_layers - 1:
        raise ConfigError(
            f"--structkv-pivot: layer {config.structkv_pivot} leaves no layer to prune; the model has {num_layers} "
            f"layers, so the pivot must be at most {num_layers - 2}"
        )


def check_sglang_version(installed: Optional[str], environ: Mapping[str, str]) -> None:
    """Refuse an SGLang release other than :data:`PINNED_SGLANG` (``installed``: its version, None
    when SGLang is not installed) unless ``environ`` sets :data:`ALLOW_OTHER_SGLANG_ENV` to 1."""
    if installed is None:
        raise ConfigError(
            f"sglang is not installed: sglang-pask needs sglang=={PINNED_SGLANG} (make serve installs it)"
        )
    if installed != PINNED_SGLANG and environ.get(ALLOW_OTHER_SGLANG_ENV) != "1":
        raise ConfigError(
            f"sglang {installed} is installed, but sglang-pask's hooks are written against sglang {PINNED_SGLANG}; "
            f"install sglang=={PINNED_SGLANG} (make serve does), or set {ALLOW_OTHER_SGLANG_ENV}=1 to try anyway"
        )


#: Prefixes of SGLang's quantized ``--kv-cache-dtype`` values (fp8_e4m3, fp8_e5m2, fp4_e2m1, ...).
QUANTIZED_KV_DTYPES = ("fp8", "fp4", "nvfp4", "mxfp4", "int8", "int4")


def check_kv_cache_dtype(sglang_argv: list[str]) -> None:
    """Refuse SGLang's quantized KV cache dtypes: the layer-group pool does not compose with them yet."""
    dtype = flag_value(sglang_argv, "--kv-cache-dtype")
    if dtype is not None and dtype.strip().lower().startswith(QUANTIZED_KV_DTYPES):
        raise ConfigError(
            f"--kv-cache-dtype {dtype}: the layer-group pool does not serve SGLang's quantized KV dtypes yet (it is "
            "built and tested for KV in the model's dtype; its low-bit blocks are written bytewise into slots sized by "
            "that element); drop the flag (for low-bit KV use --kv-dropped 2bit or k4v2)"
        )


def check_parallelism(config: "PaskConfig", sglang_argv: list[str]) -> None:
    """Refuse the parallel layouts the layer-group pool does not serve: pipeline parallelism (each
    stage would hold some layers of the groups), and StructKV under tensor parallelism (each rank
    would pick its pivot and skeleton from its own heads' scores, and the ranks' rows would diverge).
    Tensor parallelism itself is served: the policies' scores are summed over the ranks."""
    if parallel_size(sglang_argv, PARALLEL_SIZE_FLAGS[2]) > 1:
        raise ConfigError(
            "--pp-size: the layer-group pool does not serve pipeline parallelism (it plans groups over all of "
            "the model's layers in one process); use --tp-size or --dp-size"
        )
    tp = parallel_size(sglang_argv, PARALLEL_SIZE_FLAGS[0])
    if config.structkv and tp > 1:
        raise ConfigError(
            f"--structkv with --tp-size {tp}: StructKV's pivot and skeleton come from each rank's own attention "
            "heads, so the ranks would compute different rows; serve StructKV with --tp-size 1 (use --dp-size "
            "to scale out)"
        )


def check_tokenizer_workers(sglang_argv: list[str]) -> None:
    """Refuse more than one tokenizer worker: SGLang starts those HTTP workers from the app's import
    path without loading plugins, so this project's request checks and response fields would be
    missing there while the scheduler compresses (and no start-up self-check would say so)."""
    workers = flag_value(sglang_argv, "--tokenizer-worker-num")
    if workers is not None and workers.strip() not in ("", "1"):
        raise ConfigError(
            f"--tokenizer-worker-num {workers}: SGLang starts extra tokenizer workers without its plugins, so "
            "sglang-pask's request checks and response fields would be missing there; serve with one tokenizer "
            "worker (the default)"
        )


def structkv_prefill_flags(config: "PaskConfig", sglang_argv: list[str]) -> list[str]:
    """SGLang flags StructKV needs: one extend per uncached prompt part, so chunked prefill is off
    (``--chunked-prefill-size -1``) unless the user chose a chunk size, which is refused. The segment
    skeleton reads the tokenizer's vocabulary through the xgrammar grammar backend, so another
    ``--grammar-backend`` or ``--skip-tokenizer-init`` is refused with it."""
    if not config.structkv:
        return []
    if config.structkv_select == "segments":
        backend = flag_value(sglang_argv, "--grammar-backend")
        if backend is not None and backend.strip() != "xgrammar":
            raise ConfigError(
                f"--structkv-select segments: reads the vocabulary of the xgrammar grammar backend, "
                f"got --grammar-backend {backend} (use xgrammar or --structkv-select tokens)"
            )
        if has_flag(sglang_argv, "--skip-tokenizer-init"):
            raise ConfigError(
                "--structkv-select segments: needs the tokenizer, got --skip-tokenizer-init "
                "(drop it or use --structkv-select tokens)"
            )
    chunk = flag_value(sglang_argv, "--chunked-prefill-size")
    if chunk is None:
        return ["--chunked-prefill-size", "-1"]
    if chunk.strip() != "-1":
        raise ConfigError(
            f"--structkv: prunes the whole uncached prompt in one extend and needs chunked prefill off; "
            f"got --chunked-prefill-size {chunk} (drop it or pass -1)"
        )
    return []


def attention_backend_flags(config: "PaskConfig", sglang_argv: list[str], gpu: bool) -> list[str]:
    """SGLang flags for an attention backend that reads the layer groups' KV, or a ConfigError.

    Every backend flag given must name one of :data:`LAYER_GROUP_BACKENDS`; without one, the
    backend is ``triton`` on a GPU and ``torch_native`` on a CPU (StructKV runs on both). On a GPU,
    prefill CUDA graphs are turned off and decode graphs stay on where the triton backend can replay
    them (:func:`_cuda_graph_flags`). On a CPU, triton runs only under Triton's interpreter (``TRITON_INTERPRET=1``), which
    computes bf16/fp16 attention wrongly, so it needs ``--dtype float32``.
    """
    used = []
    for flag in _BACKEND_FLAGS:
        value = flag_value(sglang_argv, flag)
        if value is None:
            continue
        if value not in LAYER_GROUP_BACKENDS:
            raise ConfigError(
                f"{flag}: sglang-pask reads each layer group's KV through the "
                f"{' or '.join(LAYER_GROUP_BACKENDS)} attention backend, got {value!r}"
            )
        used.append(value)
    extra: list[str] = []
    if flag_value(sglang_argv, "--attention-backend") is None:
        default = "triton" if gpu else "torch_native"
        extra += ["--attention-backend", default]
        used.append(default)
    if "triton" in used:
        _check_triton(config, sglang_argv, gpu)
    if gpu and not has_flag(sglang_argv, "--disable-cuda-graph"):
        extra += _cuda_graph_flags(sglang_argv, used)
    return extra


def _cuda_graph_flags(sglang_argv: list[str], backends: list[str]) -> list[str]:
    """SGLang's per-phase CUDA-graph flags on a GPU: prefill graphs off (an extend pass compresses,
    and StructKV prunes, in Python between layers); decode graphs on where every backend is triton,
    off otherwise."""
    if has_flag(sglang_argv, "--cuda-graph-config"):
        raise ConfigError(
            "--cuda-graph-config: sglang-pask sets SGLang's CUDA-graph backend per phase itself; use "
            "--disable-cuda-graph or --cuda-graph-backend-decode disabled instead"
        )
    extra: list[str] = []
    prefill = flag_value(sglang_argv, "--cuda-graph-backend-prefill")
    if prefill is None:
        extra += ["--cuda-graph-backend-prefill", "disabled"]
    elif prefill != "disabled":
        raise ConfigError(
            f"--cuda-graph-backend-prefill {prefill}: an sglang-pask extend pass compresses the layer "
            "groups in Python between layers and cannot be captured (drop the flag or pass disabled)"
        )
    decode = flag_value(sglang_argv, "--cuda-graph-backend-decode")
    if all(backend == "triton" for backend in backends):
        if decode != "disabled" and os.environ.get(METADATA_GLUE_ENV) == "1":
            raise ConfigError(
                f"{METADATA_GLUE_ENV}=1: SGLang would capture the decode metadata preparation, where "
                "sglang-pask builds each layer group's read lists in Python every step (unset it)"
            )
        return extra
    if decode is None:
        return extra + ["--cuda-graph-backend-decode", "disabled"]
    if decode != "disabled":
        raise ConfigError(
            f"--cuda-graph-backend-decode {decode}: only the triton attention backend reads the layer groups "
            "from CUDA-graph buffers (drop the flag or pass disabled)"
        )
    return extra


def _check_triton(config: "PaskConfig", sglang_argv: list[str], gpu: bool) -> None:
    if has_flag(sglang_argv, "--enable-deterministic-inference"):
        raise ConfigError(
            "--enable-deterministic-inference: SGLang's deterministic triton kernel reads the fresh "
            "tokens by their virtual ids, not the layer groups' slots (use torch_native)"
        )
    page_size = (flag_value(sglang_argv, "--page-size") or "1").strip()
    if page_size != "1":
        raise ConfigError(f"--page-size: layer groups on the triton backend read one-token pages only, got {page_size}")
    if not gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            "--attention-backend triton: without a GPU it runs only under Triton's interpreter; "
            "set TRITON_INTERPRET=1 (slow, for tests)"
        )
    if not gpu and (flag_value(sglang_argv, "--dtype") or "auto") != "float32":
        raise ConfigError(
            "--attention-backend triton: Triton's interpreter on a CPU computes bf16/fp16 attention "
            "wrongly; pass --dtype float32"
        )
