"""Flag handling of ``python -m sglang_pask.launch_server``: bad values exit 2 with one line, early."""

import json
import re
import subprocess
import sys
import time

import pytest

from sglang_pask.config import ConfigError

LAUNCHER = [sys.executable, "-m", "sglang_pask.launch_server"]


def run_launcher(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCHER, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-budget", "1.5"], "argument --kv-budget: must be in (0, 1], got 1.5"),
        (["--kv-budget", "0"], "argument --kv-budget: must be in (0, 1], got 0"),
        (["--kv-budget=-0.2"], "argument --kv-budget: must be in (0, 1], got -0.2"),
        (["--kv-budget", "half"], "argument --kv-budget: must be a number, got 'half'"),
        (["--kv-policy", "snapkv-typo"], "argument --kv-policy: invalid choice: 'snapkv-typo'"),
        (["--kv-layer-groups", "0"], "argument --kv-layer-groups: the number of groups must be at least 1"),
        (
            ["--kv-layer-groups", "0-3,5-9"],
            "argument --kv-layer-groups: ranges must start at layer 0 and be contiguous",
        ),
        (["--kv-layer-groups", "x"], "argument --kv-layer-groups: expected a number of groups"),
        (["--kv-score-window", "0"], "argument --kv-score-window: must be a whole number of queries >= 1, got 0"),
        (["--kv-score-window", "x"], "argument --kv-score-window: must be a whole number, got 'x'"),
        (["--kv-decode", "drop"], "argument --kv-decode: invalid choice: 'drop'"),
        (["--kv-dropped", "1bit"], "argument --kv-dropped: invalid choice: '1bit'"),
        (
            ["--kv-policy", "snapkv", "--kv-budget", "0.2", "--kv-dropped", "2bit"],
            "--kv-dropped 2bit needs --kv-decode keep",
        ),
        (["--structkv-kv-ratio", "0.3"], "error: --structkv-kv-ratio needs --structkv"),
        (
            ["--structkv", "--structkv-prefill-ratio", "0"],
            "argument --structkv-prefill-ratio: must be in (0, 1], got 0",
        ),
        (["--structkv", "--structkv-pivot", "x"], "argument --structkv-pivot: must be 'auto' or a layer index >= 1"),
        (["--structkv", "--structkv-mode", "nope"], "argument --structkv-mode: invalid choice: 'nope'"),
        (
            ["--structkv", "--structkv-mode", "fixed-pivot"],
            "--structkv-mode fixed-pivot needs a fixed --structkv-pivot N",
        ),
        (["--structkv", "--chunked-prefill-size", "512"], "needs chunked prefill off; got --chunked-prefill-size 512"),
        (
            ["--structkv", "--structkv-window", "0"],
            "argument --structkv-window: must be a whole number of queries >= 1, got 0",
        ),
        (["--structkv", "--structkv-select", "words"], "argument --structkv-select: invalid choice: 'words'"),
        (["--structkv-select", "tokens"], "error: --structkv-select needs --structkv"),
        (["--structkv", "--structkv-kv-score", "max"], "argument --structkv-kv-score: invalid choice: 'max'"),
        (["--structkv-kv-score", "centrality"], "error: --structkv-kv-score needs --structkv"),
        (
            ["--structkv", "--grammar-backend", "outlines"],
            "--structkv-select segments: reads the vocabulary of the xgrammar grammar backend, got --grammar-backend outlines",
        ),
        (["--structkv", "--skip-tokenizer-init"], "--structkv-select segments: needs the tokenizer"),
        (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3: the layer-group pool does not serve SGLang's"),
        (["--tokenizer-worker-num", "2"], "--tokenizer-worker-num 2: SGLang starts extra tokenizer workers without"),
        (["--pp-size", "2"], "--pp-size: the layer-group pool does not serve pipeline parallelism"),
        (["--structkv", "--tp-size", "2"], "--structkv with --tp-size 2: StructKV's pivot and skeleton come from"),
        (["--structkv", "--tensor-parallel-size=2"], "--structkv with --tp-size 2"),
        (
            ["--kv-policy", "streaming-llm", "--kv-policy-args", "sinks=8"],
            "--kv-policy-args sinks=8: policy 'streaming-llm' has no option 'sinks'; its options: num_sinks",
        ),
        (
            ["--kv-policy", "snapkv", "--kv-policy-args", "kernel_size=4"],
            "--kv-policy-args kernel_size=4: snapkv: kernel_size must be a positive odd number, got 4",
        ),
        (
            ["--kv-policy-args", "kernel_size"],
            "argument --kv-policy-args: expected KEY=VALUE[,KEY=VALUE...], got 'kernel_size'",
        ),
        (["--structkv-min-prompt", "1024"], "error: --structkv-min-prompt needs --structkv"),
        (
            ["--structkv", "--structkv-min-prompt", "-1"],
            "argument --structkv-min-prompt: must be a whole number of tokens >= 0, got -1",
        ),
    ],
)
def test_invalid_value_exits_2_with_one_line_naming_the_flag(args, message):
    started = time.monotonic()
    result = run_launcher(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert time.monotonic() - started < 30, "validation must happen before anything heavy loads"


def test_layer_groups_checked_against_the_model_before_it_loads(tiny_model_dir):
    result = run_launcher("--model-path", str(tiny_model_dir), "--kv-layer-groups", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m sglang_pask.launch_server: error: --kv-layer-groups: 3 groups requested but the model has 2 layers"
    ]
    result = run_launcher("--model-path", str(tiny_model_dir), "--kv-layer-groups", "0-0")
    assert result.returncode == 2
    assert "ranges cover layers 0-0 but the model has 2 layers (0-1)" in result.stderr
    result = run_launcher("--model-path", str(tiny_model_dir), "--structkv", "--structkv-pivot", "1")
    assert result.returncode == 2
    assert "--structkv-pivot: layer 1 leaves no layer to prune; the model has 2 layers" in result.stderr


def test_impossible_byte_budgets_are_refused_before_the_model_loads(tiny_model_dir):
    model = ("--model-path", str(tiny_model_dir))
    both = run_launcher(*model, "--kv-policy", "snapkv", "--kv-bytes", "0.3", "--kv-budget", "0.2")
    assert both.returncode == 2 and "--kv-bytes sets --kv-budget: give one of the two" in both.stderr
    below = run_launcher(
        *model, "--kv-policy", "snapkv", "--kv-bytes", "0.1", "--kv-dropped", "k4v2", "--kv-decode", "keep"
    )
    assert below.returncode == 2
    assert "--kv-bytes 0.1: with --kv-dropped k4v2 every prompt token not kept in full still costs" in below.stderr


def test_unknown_flag_is_rejected_by_sglang_parser(tiny_model_dir):
    result = run_launcher("--model-path", str(tiny_model_dir), "--no-such-flag", "1")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag 1" in result.stderr


def test_help_lists_sglang_and_own_flags():
    result = run_launcher("--help")
    assert result.returncode == 0
    from sglang_pask.config import flag_name, flag_specs

    own = [flag_name(name) for name, _ in flag_specs()]
    assert {"--kv-policy-args", "--structkv-min-prompt"} <= set(own)
    for flag in ("--model-path", "--attention-backend", *own):
        assert flag in result.stdout
    assert "sglang-pask" in result.stdout


def cpu_prepared_argv(model_dir, args: list[str]) -> list[str]:
    """The SGLang argv the launcher's ``prepare`` builds for ``args`` on a CPU, in a fresh process
    (skips the test on a GPU machine, where the CPU defaults do not apply)."""
    code = (
        "import json, sys, torch\n"
        "from sglang_pask.launch_server import prepare\n"
        "if torch.cuda.is_available(): print(json.dumps('gpu')); sys.exit(0)\n"
        "_, argv = prepare(json.loads(sys.argv[1]))\n"
        "print(json.dumps(argv))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(["--model-path", str(model_dir), *args])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout.strip().splitlines()[-1])
    if argv == "gpu":
        pytest.skip("the CPU defaults apply only without a GPU")
    return argv


def test_cpu_defaults_make_an_idle_scheduler_wait_instead_of_spinning(tiny_model_dir):
    for given in ([], ["--sleep-on-idle"]):
        # Added once, not twice when the user gave it.
        assert cpu_prepared_argv(tiny_model_dir, given).count("--sleep-on-idle") == 1


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n", False),  # AVX2 only (an AMD EPYC here)
        ("flags\t\t: fpu avx2 avx512f avx512_bf16\n", True),
        ("flags\t\t: fpu avx2 avx512f amx_tile amx_bf16 amx_int8\n", True),
        ("processor\t: 0\n", True),  # no flags line: nothing assumed
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo, native):
    from sglang_pask.launch_server import cpu_has_native_bf16

    assert cpu_has_native_bf16(cpuinfo) is native


def test_a_cpu_without_native_bf16_serves_in_float32_unless_a_dtype_is_given(tiny_model_dir):
    from sglang_pask.launch_server import cpu_has_native_bf16
    from sglang_pask.sglang_argv import flag_value

    expected = None if cpu_has_native_bf16() else "float32"
    assert flag_value(cpu_prepared_argv(tiny_model_dir, []), "--dtype") == expected
    given = cpu_prepared_argv(tiny_model_dir, ["--dtype", "bfloat16"])
    assert given.count("--dtype") == 1 and flag_value(given, "--dtype") == "bfloat16"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--chunked-prefill-size", "-1"], "0.5"),  # unchunked: SGLang would reserve 16K tokens of activations
        (["--structkv"], "0.5"),  # StructKV turns chunked prefill off itself
        (["--chunked-prefill-size", "-1", "--mem-fraction-static", "0.7"], "0.7"),  # the user's choice stays
        ([], None),
    ],
)
def test_unchunked_prefill_on_cpu_gets_a_cpu_sized_static_memory_fraction(tiny_model_dir, args, expected):
    from sglang_pask.sglang_argv import flag_value

    assert flag_value(cpu_prepared_argv(tiny_model_dir, args), "--mem-fraction-static") == expected


@pytest.mark.parametrize(
    "args, gpu, env, message",
    [
        (
            ["--attention-backend", "flashinfer"],
            True,
            {},
            (
                "--attention-backend: sglang-pask reads each layer "
                "group's KV through the torch_native or triton attention backend, got 'flashinfer'"
            ),
        ),
        (["--decode-attention-backend", "fa3"], True, {}, "--decode-attention-backend: sglang-pask reads"),
        (
            ["--attention-backend", "triton", "--dtype", "float32"],
            False,
            {},
            "without a GPU it runs only under Triton's interpreter; set TRITON_INTERPRET=1",
        ),
        (["--attention-backend", "triton"], False, {"TRITON_INTERPRET": "1"}, "pass --dtype float32"),
        (["--enable-deterministic-inference"], True, {}, "--enable-deterministic-inference: SGLang's deterministic"),
        (
            ["--page-size", "16"],
            True,
            {},
            "--page-size: layer groups on the triton backend read one-token pages only, got 16",
        ),
    ],
)
def test_attention_backend_that_cannot_read_layer_groups_is_refused(args, gpu, env, message, monkeypatch):
    from sglang_pask.config import ConfigError
    from sglang_pask.config_rules import attention_backend_flags
    from sglang_pask.launch_server import split_argv

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config, sglang_argv = split_argv(args)
    with pytest.raises(ConfigError, match=re.escape(message)):
        attention_backend_flags(config, sglang_argv, gpu)


def test_attention_backend_defaults_triton_on_a_gpu_torch_native_on_a_cpu(monkeypatch):
    from sglang_pask.config_rules import attention_backend_flags
    from sglang_pask.launch_server import split_argv

    no_prefill_graphs = ["--cuda-graph-backend-prefill", "disabled"]
    config, sglang_argv = split_argv(["--kv-policy", "snapkv", "--kv-budget", "0.33", "--kv-decode", "keep"])
    assert attention_backend_flags(config, sglang_argv, gpu=True) == [
        "--attention-backend",
        "triton",
        *no_prefill_graphs,
    ]
    assert attention_backend_flags(config, sglang_argv, gpu=False) == ["--attention-backend", "torch_native"]
    config, sglang_argv = split_argv(["--attention-backend", "torch_native", "--disable-cuda-graph"])
    assert attention_backend_flags(config, sglang_argv, gpu=True) == []
    config, sglang_argv = split_argv(["--structkv"])  # StructKV's pruned prefill runs on triton too
    assert attention_backend_flags(config, sglang_argv, gpu=True) == [
        "--attention-backend",
        "triton",
        *no_prefill_graphs,
    ]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    config, sglang_argv = split_argv(["--attention-backend", "triton", "--dtype", "float32"])
    assert attention_backend_flags(config, sglang_argv, gpu=False) == []


@pytest.mark.parametrize(
    "args, decode_graphs",
    [
        (["--kv-policy", "pask", "--kv-budget", "0.33", "--kv-decode", "keep"], True),
        (["--kv-policy", "snapkv", "--kv-budget", "0.02", "--kv-dropped", "k4v2", "--kv-decode", "lowbit"], True),
        (["--kv-policy", "streaming-llm", "--kv-budget", "0.33"], True),
        (["--kv-policy", "h2o", "--kv-budget", "0.33", "--kv-decode", "compress"], True),  # scores in the graph
        (["--attention-backend", "torch_native"], False),
        (["--decode-attention-backend", "triton", "--prefill-attention-backend", "torch_native"], False),
    ],
)
def test_decode_cuda_graphs_stay_on_where_the_triton_backend_replays_them(args, decode_graphs):
    """Prefill graphs are always off; decode graphs only where every backend is triton."""
    from sglang_pask.config_rules import attention_backend_flags
    from sglang_pask.launch_server import split_argv

    config, sglang_argv = split_argv(args)
    extra = attention_backend_flags(config, sglang_argv, gpu=True)
    assert extra[extra.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    assert "--disable-cuda-graph" not in extra
    if decode_graphs:
        assert "--cuda-graph-backend-decode" not in extra
    else:
        assert extra[extra.index("--cuda-graph-backend-decode") + 1] == "disabled"


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--cuda-graph-config", '{"decode": {"backend": "full"}}'], {}, "--cuda-graph-config: sglang-pask sets"),
        (["--cuda-graph-backend-prefill", "full"], {}, "--cuda-graph-backend-prefill full: an sglang-pask extend"),
        (
            ["--attention-backend", "torch_native", "--cuda-graph-backend-decode", "full"],
            {},
            "--cuda-graph-backend-decode full: only the triton attention backend reads the layer groups",
        ),
        (
            ["--kv-decode", "keep"],
            {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1"},
            "SGLANG_ENABLE_METADATA_GLUE_GRAPH=1: SGLang would capture the decode metadata preparation",
        ),
    ],
)
def test_cuda_graph_flags_that_cannot_hold_are_refused(args, env, message, monkeypatch):
    from sglang_pask.config import ConfigError
    from sglang_pask.config_rules import attention_backend_flags
    from sglang_pask.launch_server import split_argv

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config, sglang_argv = split_argv(args)
    with pytest.raises(ConfigError, match=re.escape(message)):
        attention_backend_flags(config, sglang_argv, gpu=True)


def test_low_bit_dropped_tokens_are_served_on_triton():
    """The recommended function-call configuration gets the GPU's default backend (the fused decode kernel)."""
    from sglang_pask.config_rules import attention_backend_flags
    from sglang_pask.launch_server import split_argv

    config, sglang_argv = split_argv(
        ["--kv-policy", "snapkv", "--kv-budget", "0.02", "--kv-dropped", "k4v2", "--kv-decode", "lowbit"]
    )
    assert attention_backend_flags(config, sglang_argv, gpu=True)[:2] == ["--attention-backend", "triton"]


@pytest.mark.parametrize(
    "ranks, cpus, binding",
    [
        (2, [0, 1], "0|1"),
        (2, list(range(16)), "0-7|8-15"),
        (3, list(range(8)), "0-2|3-5|6-7"),
        (2, [0, 2, 4, 6], "0,2|4,6"),
    ],
)
def test_each_cpu_rank_gets_its_share_of_the_cores(ranks, cpus, binding):
    from sglang_pask.launch_server import cpu_rank_binding

    assert cpu_rank_binding(ranks, cpus) == binding


def test_more_ranks_than_cores_is_refused():
    from sglang_pask.launch_server import cpu_rank_binding

    with pytest.raises(
        ConfigError, match="4 ranks .* need at least one CPU core each; this host lets the server use 2"
    ):
        cpu_rank_binding(4, [0, 1])
