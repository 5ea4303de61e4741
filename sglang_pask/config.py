"""The table of sglang-pask's flags and the validated configuration object built from it.

:class:`PaskConfig` is the one table of flag specifications: each field is one flag
(``kv_policy`` is ``--kv-policy``) and carries, in its metadata, a :class:`FlagSpec` (type, choices,
help, the rule its value alone must meet). The argparse options (:func:`add_cli_args`), the
config's dict form (:meth:`PaskConfig.to_dict`, :meth:`PaskConfig.from_dict`) and the help text all
come from it, so each name, default and help is written once. Rules that relate several flags live
in :mod:`sglang_pask.config_rules`.

The launcher parses this project's flags into a :class:`PaskConfig` (exit status 2 and a one-line
message naming the flag on bad values, before any model loads) and publishes it as JSON in the
environment variable :data:`CONFIG_ENV`. SGLang's scheduler and detokenizer are spawned processes
that inherit the environment, and the plugin (:mod:`sglang_pask.plugin`) reads the same object back
there with :meth:`PaskConfig.from_env`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

CONFIG_ENV = "SGLANG_PASK_CONFIG"

#: Policies that work end to end inside the layer-group KV pool (the names of sglang_pask.policy's
#: registry; a test keeps the two in step without importing torch here).
KV_POLICIES: tuple[str, ...] = ("full", "streaming-llm", "h2o", "snapkv", "pyramidkv", "pask")
#: What decode does with a request's generated tokens (``--kv-decode``).
KV_DECODE_MODES = ("compress", "keep", "lowbit")
#: The decode modes a PASK policy file is calibrated for (a ``lowbit`` server uses ``keep``'s:
#: sglang_pask.policy.pask_file.CALIBRATED_DECODE).
POLICY_DECODE_MODES = ("compress", "keep")
#: What happens to the tokens a layer group drops (``--kv-dropped``): freed, or kept at low precision
#: in blocks of the group's own slots: ``2bit`` keys and values at 2 bits (3/16 of their bf16
#: slots), ``k4v2`` keys at 4 and values at 2 bits (1/4).
KV_DROPPED_MODES = ("drop", "2bit", "k4v2")
#: The code widths (keys, values) of each low-bit ``--kv-dropped`` mode.
KV_DROPPED_BITS = {"2bit": (2, 2), "k4v2": (4, 2)}
#: StructKV prefill pruning (``--structkv-mode``): the paper's method and the two comparison modes
#: that share its code (a fixed, FastKV-style pivot; GemFilter-style early-layer selection).
STRUCTKV_MODES: tuple[str, ...] = ("structkv", "fixed-pivot", "gemfilter")
#: What StructKV selects (``--structkv-select``): whole sentences and lines, or single tokens.
STRUCTKV_SELECTIONS: tuple[str, ...] = ("segments", "tokens")
#: What ranks each layer group's KV keep set (``--structkv-kv-score``): the group's own window
#: scores (the paper's) or the skeleton's cross-layer centrality, the same ranking in every group.
STRUCTKV_KV_SCORES: tuple[str, ...] = ("own", "centrality")

_RANGES = re.compile(r"^\d+-\d+(,\d+-\d+)*$")
_POLICY_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^,=]+$")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag."""


@dataclass(frozen=True)
class LayerGroupSpec:
    """``--kv-layer-groups``: either a number of equal contiguous groups or explicit layer ranges.

    Exactly one of ``count`` and ``ranges`` is set. ``ranges`` holds inclusive ``(first, last)``
    layer indices in order.
    """

    count: Optional[int] = None
    ranges: Optional[tuple[tuple[int, int], ...]] = None

    @classmethod
    def parse(cls, text: str) -> "LayerGroupSpec":
        """Parse ``"4"`` (four equal groups) or ``"0-11,12-23"`` (explicit inclusive ranges)."""
        text = text.strip()
        if text.isdigit():
            count = int(text)
            if count < 1:
                raise ConfigError(f"--kv-layer-groups: the number of groups must be at least 1, got {count}")
            return cls(count=count)
        if not _RANGES.match(text):
            raise ConfigError(
                f"--kv-layer-groups: expected a number of groups (e.g. 4) or inclusive layer ranges "
                f"(e.g. 0-11,12-23), got {text!r}"
            )
        ranges = tuple(tuple(int(x) for x in part.split("-")) for part in text.split(","))
        expected_start = 0
        for first, last in ranges:
            if first > last:
                raise ConfigError(f"--kv-layer-groups: range {first}-{last} is empty (first layer after last)")
            if first != expected_start:
                raise ConfigError(
                    f"--kv-layer-groups: ranges must start at layer 0 and be contiguous; "
                    f"expected a range starting at {expected_start}, got {first}-{last}"
                )
            expected_start = last + 1
        return cls(ranges=ranges)  # type: ignore[arg-type]

    def resolve(self, num_layers: int) -> list[range]:
        """Layer ranges for a model with ``num_layers`` layers; raises ConfigError if they do not fit."""
        if self.count is not None:
            if self.count > num_layers:
                raise ConfigError(
                    f"--kv-layer-groups: {self.count} groups requested but the model has {num_layers} layers"
                )
            bounds = [round(i * num_layers / self.count) for i in range(self.count + 1)]
            return [range(bounds[i], bounds[i + 1]) for i in range(self.count)]
        assert self.ranges is not None
        covered = self.ranges[-1][1] + 1
        if covered != num_layers:
            raise ConfigError(
                f"--kv-layer-groups: ranges cover layers 0-{covered - 1} but the model has {num_layers} "
                f"layers (0-{num_layers - 1})"
            )
        return [range(first, last + 1) for first, last in self.ranges]

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        assert self.ranges is not None
        return ",".join(f"{a}-{b}" for a, b in self.ranges)


PolicyArgs = tuple[tuple[str, str], ...]


def parse_policy_args(text: str) -> PolicyArgs:
    """``"num_sinks=8,kernel_size=5"`` as ``(("num_sinks", "8"), ("kernel_size", "5"))``; the
    values stay text until :func:`sglang_pask.policy.options.policy_options` types them against
    the policy's fields. Raises ValueError on a malformed or repeated key."""
    text = text.strip()
    if not text:
        return ()
    pairs = []
    for part in text.split(","):
        part = part.strip()
        if not _POLICY_ARG.match(part):
            raise ValueError(f"expected KEY=VALUE[,KEY=VALUE...], got {part!r}")
        key, value = part.split("=", 1)
        pairs.append((key, value.strip()))
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} given more than once")
    return tuple(pairs)


def format_policy_args(pairs: PolicyArgs) -> str:
    """The flag text of :func:`parse_policy_args`'s result."""
    return ",".join(f"{key}={value}" for key, value in pairs)


# Parsers of one flag's text (argparse types): syntax only; ranges are the spec's ``check``.


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number, got {text!r}") from None


def _pivot(text: str) -> Union[str, int]:
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be 'auto' or a layer index >= 1, got {text!r}") from None


def _layer_groups(text: str) -> LayerGroupSpec:
    try:
        return LayerGroupSpec.parse(text)
    except ConfigError as err:
        raise ValueError(str(err).removeprefix("--kv-layer-groups: ")) from None


# Checks of one flag's value: None when it is fine, else what is wrong (the caller names the flag).


def _unit_interval(value: Any) -> Optional[str]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= 1.0
    return None if ok else f"must be in (0, 1], got {value}"


def _unit_interval_or_none(value: Any) -> Optional[str]:
    return None if value is None else _unit_interval(value)


def _at_least(minimum: int, unit: str) -> Callable[[Any], Optional[str]]:
    def check(value: Any) -> Optional[str]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            return f"must be a whole number of {unit} >= {minimum}, got {value!r}"
        return None

    return check


def _pivot_value(value: Any) -> Optional[str]:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f"must be 'auto' or a layer index >= 1, got {value!r}"


@dataclass(frozen=True)
class FlagSpec:
    """One row of the flag table: everything about a flag except its name and default (the field's).

    Attributes
    ----------
    help : str
        The ``--help`` text (argparse appends the default).
    parse : callable, optional
        Flag text to value (raises ValueError with what is wrong); None for plain strings and for
        ``choices`` and switches.
    check : callable, optional
        The rule the value alone must meet: None when it does, else what is wrong.
    choices : tuple of str, optional
        The allowed values.
    noun : str
        What a choice is called in the error for an unknown one (``unknown mode 'x'``).
    metavar : str, optional
        How ``--help`` names the value.
    needs : str, optional
        The switch (a field name) this flag applies under; given without it, the flag is refused.
    format : callable, optional
        Value to the JSON form of :meth:`PaskConfig.to_dict` (the flag text) where the value is not
        JSON itself; ``parse`` reads it back.
    """

    help: str
    parse: Optional[Callable[[str], Any]] = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    choices: Optional[tuple[str, ...]] = None
    noun: str = "choice"
    metavar: Optional[str] = None
    needs: Optional[str] = None
    format: Optional[Callable[[Any], Any]] = None

    def problem(self, value: Any) -> Optional[str]:
        """What is wrong with ``value`` for this flag alone, or None."""
        if self.choices is not None and value not in self.choices:
            return f"unknown {self.noun} {value!r}; choose from {', '.join(self.choices)}"
        return None if self.check is None else self.check(value)


def _flag(default: Any, help: str, **spec: Any) -> Any:
    return field(default=default, metadata={"flag": FlagSpec(help=help, **spec)})


@dataclass(frozen=True)
class PaskConfig:
    """Everything sglang-pask adds to an SGLang server: one field per flag (see the module docstring).

    Constructing one checks every value and every rule between flags
    (:func:`sglang_pask.config_rules.check_config`) and raises :class:`ConfigError` naming the flag.
    The meaning of each field is its flag's help, in the field's ``FlagSpec``.
    """

    kv_policy: str = _flag(
        "full", choices=KV_POLICIES, noun="policy", help="Which policy decides the KV each layer group keeps."
    )
    kv_budget: float = _flag(
        1.0,
        parse=_number,
        check=_unit_interval,
        metavar="FRACTION",
        help="Total KV budget as a fraction of full KV, in (0, 1].",
    )
    kv_bytes: Optional[float] = _flag(
        None,
        parse=_number,
        check=_unit_interval_or_none,
        metavar="FRACTION",
        help="KV memory per request as a share of full KV's bytes at the served KV dtype, in (0, 1]; sets "
        "--kv-budget (give one of the two). With --kv-dropped drop the budget is this share; with 2bit or k4v2 "
        "it is what is left after every other prompt token is stored at low bits (refused at or below that "
        "format's own cost: 3/16 or 1/4 of a bf16 slot); with --kv-policy pask and a low-bit --kv-dropped, a "
        "tiered policy file solved for this share decides per layer group and role what stays in full, at low "
        "bits or is evicted (the shipped one for the served model when --pask-policy is not given). The "
        "window, attention sinks and generated tokens come on top.",
    )
    kv_policy_args: PolicyArgs = _flag(
        (),
        parse=parse_policy_args,
        format=format_policy_args,
        metavar="KEY=VALUE[,...]",
        help="Options of the chosen policy, checked against its own fields: streaming-llm num_sinks; snapkv "
        "and pask kernel_size; pyramidkv kernel_size and beta (e.g. num_sinks=8).",
    )
    kv_layer_groups: LayerGroupSpec = _flag(
        LayerGroupSpec(count=1),
        parse=_layer_groups,
        format=str,
        metavar="N|A-B,C-D,...",
        help="Layer groups: a number of equal contiguous groups, or inclusive layer ranges that cover all "
        "layers, e.g. 0-11,12-23.",
    )
    kv_window: int = _flag(
        8,
        parse=_whole_number,
        check=_at_least(0, "tokens"),
        metavar="TOKENS",
        help="Recent window: the newest tokens of a request every layer group keeps.",
    )
    kv_score_window: Optional[int] = _flag(
        None,
        parse=_whole_number,
        check=_at_least(1, "queries"),
        metavar="QUERIES",
        help="Observation window: how many of the newest queries score the keys for snapkv, pyramidkv and "
        "pask (default: the --kv-window).",
    )
    kv_decode: str = _flag(
        "compress",
        choices=KV_DECODE_MODES,
        noun="mode",
        help="What decode does with generated tokens: 'compress' (each layer group keeps about its budget of "
        "them, so a request's whole KV stays near the budget), 'keep' (never dropped; the budget applies to "
        "the prompt, as SnapKV defines it) or 'lowbit' (as keep, but those older than --kv-window go to a "
        "low-bit block of the --kv-dropped format each time 32 of them fill one; needs --kv-dropped 2bit or "
        "k4v2).",
    )
    kv_dropped: str = _flag(
        "drop",
        choices=KV_DROPPED_MODES,
        noun="mode",
        help="What happens to a token a layer group drops: 'drop' (its KV leaves the group), '2bit' (it stays "
        "readable at 2 bits, keys per channel and values per token in blocks of 32 tokens, in the group's own "
        "slots: --kv-budget is then the share kept at full precision, and each dropped token costs 3/16 of a "
        "bf16 slot) or 'k4v2' (the same with keys at 4 bits: 1/4 of a bf16 slot); the low-bit modes need "
        "--kv-decode keep or lowbit.",
    )
    pask_policy: Optional[str] = _flag(
        None,
        metavar="FILE",
        help="Calibrated PASK policy file for --kv-policy pask (python -m sglang_pask.calibrate writes one; "
        "default: the file shipped for the served model and --kv-decode mode, if one ships).",
    )
    strict_tools: bool = _flag(
        False,
        help="Hold every tool call's arguments to its tool's JSON Schema, as SGLang does for tools marked "
        "strict (SGLANG_TOOL_STRICT_LEVEL=2): without it, tool_choice required or a named tool constrains "
        "the call's format and function name, but the arguments of a tool without strict: true may be any "
        "JSON object.",
    )
    structkv: bool = _flag(
        False,
        help="StructKV prefill pruning: layers up to a pivot see the whole prompt and accumulate centrality, "
        "later layers compute only on the skeleton; each layer group keeps R_KV of the prompt's KV for decode, "
        "where --kv-policy then applies. Disables chunked prefill unless --chunked-prefill-size is given.",
    )
    structkv_min_prompt: int = _flag(
        4096,
        parse=_whole_number,
        check=_at_least(0, "tokens"),
        metavar="TOKENS",
        needs="structkv",
        help="StructKV prunes only prompts of at least this many tokens; shorter ones are served unpruned "
        "(at 2K tokens R_KV 0.1 keeps about 200 tokens, where StructKV lost accuracy; 0 prunes every prompt).",
    )
    structkv_prefill_ratio: float = _flag(
        0.2,
        parse=_number,
        check=_unit_interval,
        metavar="R_STRUCT",
        needs="structkv",
        help="Skeleton share of the computed prompt part, in (0, 1].",
    )
    structkv_kv_ratio: float = _flag(
        0.1,
        parse=_number,
        check=_unit_interval,
        metavar="R_KV",
        needs="structkv",
        help="Share of the computed prompt part whose KV each layer group keeps, in (0, 1].",
    )
    structkv_pivot: Union[str, int] = _flag(
        "auto",
        parse=_pivot,
        check=_pivot_value,
        metavar="auto|N",
        needs="structkv",
        help="Pivot layer: detected per prompt from attention entropy, top-k mass and variance (auto), or "
        "the 0-based layer N.",
    )
    structkv_mode: str = _flag(
        "structkv",
        choices=STRUCTKV_MODES,
        noun="mode",
        needs="structkv",
        help="structkv (decayed centrality up to the pivot, continue on the skeleton), fixed-pivot "
        "(FastKV-style: the pivot layer's own scores) or gemfilter (layer N's scores, prefill restarts from "
        "layer 0 on the skeleton); the last two need --structkv-pivot N.",
    )
    structkv_window: int = _flag(
        # 32 reaches back into the question on the default model (the paper uses 8):
        # bench/results/structkv_segments_2026-12-03.md.
        32,
        parse=_whole_number,
        check=_at_least(1, "queries"),
        metavar="W",
        needs="structkv",
        help="StructKV's observation window: the newest prompt tokens whose queries score the prompt "
        "(centrality, pivot statistics, the KV each group keeps); the skeleton always holds them (the paper "
        "uses 8).",
    )
    structkv_select: str = _flag(
        "segments",
        choices=STRUCTKV_SELECTIONS,
        needs="structkv",
        help="What the skeleton and each layer group's KV keep set are chosen in: 'segments' (whole sentences "
        "and lines, ranked by their tokens' mean score) or 'tokens' (single tokens, max-pooled over 7 "
        "neighbours, as the paper).",
    )
    structkv_kv_score: str = _flag(
        "own",
        choices=STRUCTKV_KV_SCORES,
        needs="structkv",
        help="What ranks the KV each layer group keeps for decode (R_KV of the prompt, among the tokens the "
        "group computed): 'own' (the group's own window scores, as the paper) or 'centrality' (the "
        "cross-layer centrality the skeleton was chosen from, the same ranking in every group).",
    )

    def __post_init__(self) -> None:
        for name, spec in flag_specs():
            problem = spec.problem(getattr(self, name))
            if problem is not None:
                raise ConfigError(f"{flag_name(name)}: {problem}")
        from sglang_pask.config_rules import check_config

        check_config(self)

    def to_dict(self) -> dict:
        """Plain JSON-serializable form: one key per field, values as JSON or as their flag text."""
        data = {}
        for name, spec in flag_specs():
            value = getattr(self, name)
            data[name] = spec.format(value) if spec.format is not None else value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PaskConfig":
        """Inverse of :meth:`to_dict` (missing keys take their defaults); raises ConfigError on unknown
        keys or bad values."""
        specs = dict(flag_specs())
        unknown = set(data) - set(specs)
        if unknown:
            raise ConfigError(f"unknown sglang-pask config keys: {', '.join(sorted(unknown))}")
        values = {}
        for name, value in data.items():
            parse = specs[name].parse
            if parse is not None and isinstance(value, str):
                try:
                    value = parse(value)
                except ValueError as err:
                    raise ConfigError(f"{flag_name(name)}: {err}") from None
            values[name] = value
        return cls(**values)

    def publish(self) -> None:
        """Put this config into the environment, where spawned SGLang processes find it."""
        os.environ[CONFIG_ENV] = json.dumps(self.to_dict())

    @classmethod
    def from_env(cls) -> Optional["PaskConfig"]:
        """The config the launcher published, or None when SGLang was started without sglang-pask."""
        raw = os.environ.get(CONFIG_ENV)
        if not raw:
            return None
        try:
            return cls.from_dict(json.loads(raw))
        except json.JSONDecodeError as err:
            raise ConfigError(f"{CONFIG_ENV} is not valid JSON: {err}") from err


def flag_name(field_name: str) -> str:
    """``kv_policy`` -> ``--kv-policy``."""
    return "--" + field_name.replace("_", "-")


def flag_specs() -> list[tuple[str, FlagSpec]]:
    """The flag table: ``(field name, spec)`` for every flag, in :class:`PaskConfig`'s order."""
    return [(f.name, f.metadata["flag"]) for f in fields(PaskConfig)]


def flag_default(field_name: str) -> Any:
    """The default value of a flag (its field's default)."""
    return next(f.default for f in fields(PaskConfig) if f.name == field_name)


def _argparse_type(spec: FlagSpec) -> Optional[Callable[[str], Any]]:
    """The flag's parse, then its check, as an argparse type (errors name the flag through argparse)."""
    if spec.parse is None:
        return None
    parse = spec.parse

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        problem = spec.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = parse.__name__.lstrip("_")
    return convert


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add this project's flags, as one argument group, to ``parser``.

    A flag that ``needs`` a switch has no argparse default (None), so :func:`from_namespace` can
    tell it was given; its default is the field's.
    """
    group = parser.add_argument_group("sglang-pask", "KV persistence per layer group (PASK, StructKV)")
    for name, spec in flag_specs():
        default = flag_default(name)
        if isinstance(default, bool):
            group.add_argument(flag_name(name), action="store_true", help=spec.help)
            continue
        shown = spec.format(default) if spec.format is not None else default
        help_text = spec.help if default is None else f"{spec.help} (default: {shown or 'none'})"
        group.add_argument(
            flag_name(name),
            dest=name,
            type=_argparse_type(spec),
            choices=spec.choices,
            default=None if spec.needs else default,
            metavar=spec.metavar,
            help=help_text.replace("%", "%%"),
        )


def from_namespace(args: argparse.Namespace) -> PaskConfig:
    """Build the config from flags parsed by :func:`add_cli_args`.

    Raises ConfigError when a flag comes without the switch it ``needs`` (``--structkv-*`` without
    ``--structkv``), or when the values break a rule.
    """
    values = {}
    for name, spec in flag_specs():
        value = getattr(args, name)
        if spec.needs is not None and value is not None and not getattr(args, spec.needs):
            raise ConfigError(f"{flag_name(name)} needs {flag_name(spec.needs)}")
        if value is not None:
            values[name] = value
    return PaskConfig(**values)
