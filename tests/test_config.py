"""PaskConfig and LayerGroupSpec: parsing, resolution against a model, and the environment round trip."""

import json
import re

import pytest

from sglang_pask.config import CONFIG_ENV, ConfigError, LayerGroupSpec, PaskConfig


def test_layer_group_count_splits_layers_evenly():
    groups = LayerGroupSpec.parse("4").resolve(24)
    assert [(g.start, g.stop) for g in groups] == [(0, 6), (6, 12), (12, 18), (18, 24)]
    uneven = LayerGroupSpec.parse("3").resolve(8)
    assert sum(len(g) for g in uneven) == 8 and [g.start for g in uneven] == [0, 3, 5]


def test_layer_group_ranges_resolve_and_print_back():
    spec = LayerGroupSpec.parse("0-11,12-23")
    assert [(g.start, g.stop) for g in spec.resolve(24)] == [(0, 12), (12, 24)]
    assert str(spec) == "0-11,12-23"
    assert LayerGroupSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("0", "at least 1"),
        ("abc", "expected a number of groups"),
        ("1-3,4-5", "start at layer 0"),
        ("0-3,5-9", "expected a range starting at 4"),
        ("0-3,4-2", "is empty"),
        ("0-3;4-5", "expected a number of groups"),
    ],
)
def test_layer_group_parse_errors_name_the_flag(text, fragment):
    with pytest.raises(ConfigError) as err:
        LayerGroupSpec.parse(text)
    assert str(err.value).startswith("--kv-layer-groups:") and fragment in str(err.value)


def test_layer_groups_must_fit_the_model():
    with pytest.raises(ConfigError, match="ranges cover layers 0-9 but the model has 24"):
        LayerGroupSpec.parse("0-4,5-9").resolve(24)
    with pytest.raises(ConfigError, match="5 groups requested but the model has 2 layers"):
        LayerGroupSpec.parse("5").resolve(2)


@pytest.mark.parametrize("budget", [0.0, -0.1, 1.01])
def test_budget_outside_unit_interval_is_rejected(budget):
    with pytest.raises(ConfigError, match="--kv-budget"):
        PaskConfig(kv_budget=budget)


def test_unknown_policy_is_rejected():
    with pytest.raises(ConfigError, match="--kv-policy: unknown policy 'nope'"):
        PaskConfig(kv_policy="nope")


def test_environment_round_trip(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert PaskConfig.from_env() is None
    config = PaskConfig(kv_policy="full", kv_budget=0.5, kv_layer_groups=LayerGroupSpec.parse("0-1,2-3"))
    config.publish()
    assert json.loads(__import__("os").environ[CONFIG_ENV])["kv_layer_groups"] == "0-1,2-3"
    assert PaskConfig.from_env() == config


def test_broken_environment_config_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(CONFIG_ENV, "{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        PaskConfig.from_env()
    monkeypatch.setenv(CONFIG_ENV, json.dumps({"kv_policy": "full", "bogus": 1}))
    with pytest.raises(ConfigError, match="unknown sglang-pask config keys: bogus"):
        PaskConfig.from_env()


def test_structkv_defaults_and_round_trip(monkeypatch):
    config = PaskConfig(
        kv_policy="snapkv",
        kv_budget=0.5,
        structkv=True,
        structkv_pivot=7,
        structkv_mode="fixed-pivot",
        structkv_prefill_ratio=0.3,
        structkv_kv_ratio=0.15,
        structkv_window=16,
        structkv_select="tokens",
        structkv_kv_score="centrality",
    )
    config.publish()
    assert PaskConfig.from_env() == config
    default = PaskConfig(structkv=True)
    assert (
        default.structkv_prefill_ratio,
        default.structkv_kv_ratio,
        default.structkv_pivot,
        default.structkv_mode,
        default.structkv_window,
        default.structkv_select,
        default.structkv_kv_score,
    ) == (0.2, 0.1, "auto", "structkv", 32, "segments", "own")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"structkv_prefill_ratio": 0.0}, "--structkv-prefill-ratio: must be in (0, 1], got 0.0"),
        ({"structkv_kv_ratio": 1.5}, "--structkv-kv-ratio: must be in (0, 1], got 1.5"),
        ({"structkv_pivot": 0}, "--structkv-pivot: must be 'auto' or a layer index >= 1, got 0"),
        ({"structkv_mode": "fastkv"}, "--structkv-mode: unknown mode 'fastkv'"),
        ({"structkv_mode": "gemfilter"}, "--structkv-mode gemfilter needs a fixed --structkv-pivot N"),
        ({"structkv": True, "kv_window": 0}, "--kv-window: StructKV keeps a window of at least 1"),
        ({"structkv_window": 0}, "--structkv-window: must be a whole number of queries >= 1, got 0"),
        ({"structkv_select": "words"}, "--structkv-select: unknown choice 'words'"),
        ({"structkv_kv_score": "pivot"}, "--structkv-kv-score: unknown choice 'pivot'; choose from own, centrality"),
    ],
)
def test_structkv_values_are_checked(kwargs, message):
    with pytest.raises(ConfigError) as err:
        PaskConfig(**kwargs)
    assert message in str(err.value)


def test_score_window_default_round_trip_and_check():
    assert PaskConfig().kv_score_window is None
    config = PaskConfig(kv_policy="snapkv", kv_budget=0.5, kv_score_window=16)
    config.publish()
    assert PaskConfig.from_env() == config
    with pytest.raises(ConfigError, match="--kv-score-window: must be a whole number of queries >= 1, got 0"):
        PaskConfig(kv_score_window=0)


def test_kv_decode_default_round_trip_and_check():
    assert PaskConfig().kv_decode == "compress"
    config = PaskConfig(kv_policy="pask", kv_budget=0.33, kv_decode="keep")
    config.publish()
    assert PaskConfig.from_env() == config
    with pytest.raises(ConfigError, match="--kv-decode: unknown mode 'drop'; choose from compress, keep, lowbit"):
        PaskConfig(kv_decode="drop")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kv_dropped": "4bit"}, "--kv-dropped: unknown mode '4bit'; choose from drop, 2bit, k4v2"),
        ({"kv_dropped": "2bit", "kv_decode": "keep"}, "--kv-dropped 2bit: nothing is dropped with --kv-policy full"),
        (
            {"kv_dropped": "2bit", "kv_policy": "snapkv", "kv_budget": 1.0, "kv_decode": "keep"},
            "nothing is dropped with --kv-policy snapkv at --kv-budget 1",
        ),
        (
            {"kv_dropped": "2bit", "kv_policy": "snapkv", "kv_budget": 0.2},
            "--kv-dropped 2bit needs --kv-decode keep or lowbit",
        ),
        (
            {"kv_dropped": "k4v2", "kv_policy": "snapkv", "kv_budget": 0.2},
            "--kv-dropped k4v2 needs --kv-decode keep or lowbit",
        ),
        (
            {"kv_decode": "lowbit", "kv_policy": "snapkv", "kv_budget": 0.2},
            "--kv-decode lowbit stores generated tokens in low-bit blocks: it needs --kv-dropped 2bit or k4v2, "
            "got --kv-dropped drop",
        ),
        (
            {"kv_dropped": "2bit", "kv_policy": "snapkv", "kv_budget": 0.2, "kv_decode": "keep", "structkv": True},
            "--kv-dropped 2bit: not supported with --structkv",
        ),
    ],
)
def test_kv_dropped_is_checked(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        PaskConfig(**kwargs)


def test_kv_dropped_default_and_round_trip(monkeypatch):
    assert PaskConfig().kv_dropped == "drop"
    for mode in ("2bit", "k4v2"):
        for decode in ("keep", "lowbit"):
            config = PaskConfig(kv_policy="pask", kv_budget=0.175, kv_decode=decode, kv_dropped=mode)
            monkeypatch.delenv(CONFIG_ENV, raising=False)
            config.publish()
            assert PaskConfig.from_env() == config


def test_every_flag_is_one_row_of_the_table():
    """Each field of PaskConfig is a flag with a spec; argparse, the dict form and the help come from it."""
    import argparse
    from dataclasses import fields

    from sglang_pask.config import add_cli_args, flag_name, flag_specs

    specs = dict(flag_specs())
    assert list(specs) == [f.name for f in fields(PaskConfig)]
    assert set(PaskConfig().to_dict()) == set(specs)
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    parsed = {action.dest: action for action in parser._actions if action.option_strings}
    for name, spec in specs.items():
        action = parsed[name]
        assert action.option_strings == [flag_name(name)]
        assert spec.help in action.help.replace("%%", "%")
        assert action.choices == spec.choices


def test_defaults_from_flags_equal_the_config_defaults():
    import argparse

    from sglang_pask.config import add_cli_args, from_namespace

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    assert from_namespace(parser.parse_args([])) == PaskConfig()
    assert from_namespace(parser.parse_args(["--structkv"])) == PaskConfig(structkv=True)


def test_flags_needing_structkv_are_refused_without_it():
    import argparse

    from sglang_pask.config import add_cli_args, flag_name, flag_specs, from_namespace

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    samples = {
        "structkv_min_prompt": "1",
        "structkv_prefill_ratio": "0.5",
        "structkv_kv_ratio": "0.5",
        "structkv_pivot": "auto",
        "structkv_mode": "structkv",
        "structkv_window": "8",
        "structkv_select": "tokens",
        "structkv_kv_score": "own",
    }
    assert [name for name, spec in flag_specs() if spec.needs == "structkv"] == list(samples)
    for name, value in samples.items():
        with pytest.raises(ConfigError, match=re.escape(f"{flag_name(name)} needs --structkv")):
            from_namespace(parser.parse_args([flag_name(name), value]))


def test_policy_args_are_typed_by_the_policy_and_round_trip(monkeypatch):
    from sglang_pask.config import parse_policy_args
    from sglang_pask.policy import policy_options, settable_options

    assert settable_options("streaming-llm") == {"num_sinks": 4}
    assert settable_options("pyramidkv") == {"kernel_size": 7, "beta": 20.0}
    assert settable_options("pask") == {"kernel_size": 7}
    assert settable_options("h2o") == {} and settable_options("full") == {}
    pairs = parse_policy_args("kernel_size=5, beta=4")
    assert pairs == (("kernel_size", "5"), ("beta", "4"))
    assert policy_options("pyramidkv", pairs) == {"kernel_size": 5, "beta": 4.0}
    config = PaskConfig(kv_policy="pyramidkv", kv_budget=0.3, kv_policy_args=pairs)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    config.publish()
    assert json.loads(__import__("os").environ[CONFIG_ENV])["kv_policy_args"] == "kernel_size=5,beta=4"
    assert PaskConfig.from_env() == config


@pytest.mark.parametrize(
    "policy, text, message",
    [
        ("streaming-llm", "sinks=8", "policy 'streaming-llm' has no option 'sinks'; its options: num_sinks"),
        ("h2o", "num_sinks=2", "policy 'h2o' has no option 'num_sinks'; its options: none"),
        ("pask", "table=x", "policy 'pask' has no option 'table'; its options: kernel_size"),
        ("snapkv", "kernel_size=seven", "kernel_size must be a whole number, got 'seven'"),
        ("pyramidkv", "beta=0.5", "pyramidkv: beta must be at least 1, got 0.5"),
        ("streaming-llm", "num_sinks=-1", "streaming-llm: num_sinks must be non-negative, got -1"),
    ],
)
def test_bad_policy_args_name_the_key(policy, text, message):
    from sglang_pask.config import parse_policy_args

    with pytest.raises(ConfigError) as err:
        PaskConfig(kv_policy=policy, kv_budget=0.3, kv_policy_args=parse_policy_args(text))
    assert str(err.value) == f"--kv-policy-args {text}: {message}"


@pytest.mark.parametrize(
    "text, message",
    [("k", "expected KEY=VALUE"), ("a=1,a=2", "a given more than once"), ("a=1,,b=2", "expected KEY=VALUE")],
)
def test_malformed_policy_args_are_refused(text, message):
    from sglang_pask.config import parse_policy_args

    with pytest.raises(ValueError, match=message):
        parse_policy_args(text)


def test_structkv_min_prompt_default_and_check():
    assert PaskConfig(structkv=True).structkv_min_prompt == 4096
    assert PaskConfig(structkv=True, structkv_min_prompt=0).structkv_min_prompt == 0
    with pytest.raises(ConfigError, match=re.escape("--structkv-min-prompt: must be a whole number of tokens >= 0")):
        PaskConfig(structkv=True, structkv_min_prompt=-5)


def test_the_readme_documents_every_flag():
    """The README's flag table names every row of the flag table (and no flag that is not one)."""
    from pathlib import Path

    from sglang_pask.config import flag_name, flag_specs

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = {
        line.split("|")[1].strip().strip("`").split()[0] for line in readme.splitlines() if line.startswith("| `--")
    }
    assert table == {flag_name(name) for name, _ in flag_specs()}
