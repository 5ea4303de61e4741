"""One validated configuration object for sglang-pask, and how it travels to every SGLang process.

The launcher parses this project's flags into a :class:`PaskConfig`, validates it (exit status 2 and
a one-line message naming the flag on bad values, before any model loads) and publishes it as JSON in
the environment variable :data:`CONFIG_ENV`. SGLang's scheduler and detokenizer are spawned
processes that inherit the environment, and the plugin (:mod:`sglang_pask.plugin`) reads the same
object back there with :func:`PaskConfig.from_env`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Optional, Union

CONFIG_ENV = "SGLANG_PASK_CONFIG"

# Policies that work end to end inside the layer-group KV pool (the names of sglang_pask.policy's
# registry; a test keeps the two in step without importing torch here).
KV_POLICIES: tuple[str, ...] = ("full", "streaming-llm", "h2o", "snapkv", "pyramidkv", "pask")

# Newest tokens every layer group always keeps (--kv-window default).
DEFAULT_KV_WINDOW = 8
#: What decode does with a request's generated tokens (``--kv-decode``).
KV_DECODE_MODES = ("compress", "keep", "lowbit")
#: The decode modes a PASK policy file is calibrated for (a ``lowbit`` server uses ``keep``'s:
#: sglang_pask.policy.pask_file.CALIBRATED_DECODE).
POLICY_DECODE_MODES = ("compress", "keep")
#: What happens to the tokens a layer group drops (``--kv-dropped``): freed, or kept at low precision
#: in blocks of the group's own slots (sglang_pask.srt.layer_group_lowbit): ``2bit`` keys and values
#: at 2 bits (3/16 of their bf16 slots), ``k4v2`` keys at 4 and values at 2 bits (1/4).
KV_DROPPED_MODES = ("drop", "2bit", "k4v2")
#: The code widths (keys, values) of each low-bit ``--kv-dropped`` mode.
KV_DROPPED_BITS = {"2bit": (2, 2), "k4v2": (4, 2)}

_RANGES = re.compile(r"^\d+-\d+(,\d+-\d+)*$")

# StructKV prefill pruning (--structkv-mode): the paper's method and the two comparison modes that
# share its code (a fixed, FastKV-style pivot; GemFilter-style early-layer selection).
STRUCTKV_MODES: tuple[str, ...] = ("structkv", "fixed-pivot", "gemfilter")
# The paper's defaults: R_struct (skeleton share) and R_KV (KV share kept for decode).
DEFAULT_STRUCTKV_PREFILL_RATIO = 0.2
DEFAULT_STRUCTKV_KV_RATIO = 0.1
# StructKV's observation window: the newest prompt tokens whose queries score the prompt (the paper
# uses 8; 32 reaches back into the question on the default model, bench/results/structkv_segments_2026-12-03.md).
DEFAULT_STRUCTKV_WINDOW = 32
# What StructKV selects (--structkv-select): whole sentences and lines, or single tokens.
STRUCTKV_SELECTIONS: tuple[str, ...] = ("segments", "tokens")
DEFAULT_STRUCTKV_SELECT = "segments"
# What ranks each layer group's KV keep set (--structkv-kv-score): the group's own window scores (the
# paper's) or the skeleton's cross-layer centrality, the same ranking in every group.
STRUCTKV_KV_SCORES: tuple[str, ...] = ("own", "centrality")
DEFAULT_STRUCTKV_KV_SCORE = "own"


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


@dataclass(frozen=True)
class PaskConfig:
    """Everything sglang-pask adds to an SGLang server.

    Attributes
    ----------
    kv_policy : str
        Which KV persistence policy decides what each layer group keeps (one of :data:`KV_POLICIES`).
    kv_budget : float
        Total KV budget as a fraction of full KV, in (0, 1].
    kv_layer_groups : LayerGroupSpec
        How layers are grouped; each group keeps its own token set.
    kv_window : int
        The recent window: the newest tokens of a request that every layer group keeps.
    kv_score_window : int or None
        The observation window: how many of the newest queries score the keys for windowed policies
        (SnapKV, PyramidKV, PASK); None means ``kv_window`` (at least 1).
    kv_decode : str
        One of :data:`KV_DECODE_MODES`. ``compress``: each group keeps about its budget of the generated
        tokens too (the request's whole KV stays near the budget); ``keep``: generated tokens are never
        dropped, the budget applies to the prompt (as SnapKV and kvpress define it); ``lowbit`` (with a
        low-bit ``kv_dropped``): as ``keep``, but the generated tokens older than the window go to a
        low-bit block each time 32 of them fill one (KIVI's full-precision residual of recent tokens).
    kv_dropped : str
        One of :data:`KV_DROPPED_MODES`. ``drop``: a token a layer group drops leaves it; ``2bit``: it
        stays readable in that group at 2 bits (keys per channel, values per token, in blocks of 32
        tokens), in slots of the group's own pool, so ``--kv-budget`` is then the share kept at full
        precision and each dropped token costs 3/16 of a bf16 slot; ``k4v2``: the same with keys
        at 4 bits, 1/4 of a bf16 slot (torch_native attention only).
    pask_policy : str or None
        The calibrated PASK policy file for ``--kv-policy pask`` (None: the one shipped for the
        default model).
    structkv : bool
        StructKV prefill pruning on (``--structkv``).
    structkv_prefill_ratio : float
        ``R_struct`` in (0, 1]: the skeleton's share of the prompt part being computed.
    structkv_kv_ratio : float
        ``R_KV`` in (0, 1]: the share of that part whose KV each layer group keeps for decode.
    structkv_pivot : "auto" or int
        The pivot layer: detected per prompt (``"auto"``) or fixed (0-based, >= 1).
    structkv_mode : str
        One of :data:`STRUCTKV_MODES`; ``fixed-pivot`` and ``gemfilter`` need an integer pivot.
    structkv_window : int
        StructKV's observation window, at least 1: the newest prompt tokens whose queries score the
        prompt (centrality, pivot statistics, each group's KV choice); the skeleton always holds them.
    structkv_select : str
        One of :data:`STRUCTKV_SELECTIONS`: the skeleton and every group's KV keep set chosen by
        ``segments`` (whole sentences and lines by their tokens' mean score,
        :mod:`sglang_pask.structkv.segments`) or by ``tokens`` (single tokens, max-pooled).
    structkv_kv_score : str
        One of :data:`STRUCTKV_KV_SCORES`: what ranks every group's KV keep set: the group's own
        window scores (``own``, the paper's) or the centrality the skeleton was chosen from
        (``centrality``).
    """

    kv_policy: str = "full"
    kv_budget: float = 1.0
    kv_layer_groups: LayerGroupSpec = field(default_factory=lambda: LayerGroupSpec(count=1))
    kv_window: int = DEFAULT_KV_WINDOW
    kv_score_window: Optional[int] = None
    kv_decode: str = "compress"
    kv_dropped: str = "drop"
    pask_policy: Optional[str] = None
    structkv: bool = False
    structkv_prefill_ratio: float = DEFAULT_STRUCTKV_PREFILL_RATIO
    structkv_kv_ratio: float = DEFAULT_STRUCTKV_KV_RATIO
    structkv_pivot: Union[str, int] = "auto"
    structkv_mode: str = "structkv"
    structkv_window: int = DEFAULT_STRUCTKV_WINDOW
    structkv_select: str = DEFAULT_STRUCTKV_SELECT
    structkv_kv_score: str = DEFAULT_STRUCTKV_KV_SCORE

    def __post_init__(self) -> None:
        if self.kv_policy not in KV_POLICIES:
            raise ConfigError(f"--kv-policy: unknown policy {self.kv_policy!r}; choose from {', '.join(KV_POLICIES)}")
        if not (0.0 < self.kv_budget <= 1.0):
            raise ConfigError(f"--kv-budget: must be in (0, 1], got {self.kv_budget}")
        if self.pask_policy is not None and self.kv_policy != "pask":
            raise ConfigError(f"--pask-policy applies to --kv-policy pask only (the policy is {self.kv_policy!r})")
        if self.kv_window < 0:
            raise ConfigError(f"--kv-window: must be a non-negative number of tokens, got {self.kv_window}")
        if self.kv_score_window is not None and self.kv_score_window < 1:
            raise ConfigError(f"--kv-score-window: must be at least 1 query, got {self.kv_score_window}")
        if self.kv_decode not in KV_DECODE_MODES:
            raise ConfigError(f"--kv-decode: unknown mode {self.kv_decode!r}; choose from {', '.join(KV_DECODE_MODES)}")
        if self.kv_decode == "lowbit" and self.kv_dropped not in ("2bit", "k4v2"):
            raise ConfigError(f"--kv-decode lowbit stores generated tokens in low-bit blocks: it needs --kv-dropped "
                              f"2bit or k4v2, got --kv-dropped {self.kv_dropped}")
        self._check_kv_dropped()
        self._check_structkv()

    def _check_kv_dropped(self) -> None:
        if self.kv_dropped not in KV_DROPPED_MODES:
            raise ConfigError(
                f"--kv-dropped: unknown mode {self.kv_dropped!r}; choose from {', '.join(KV_DROPPED_MODES)}")
        if self.kv_dropped == "drop":
            return
        if self.kv_policy == "full" or self.kv_budget >= 1.0:
            raise ConfigError(f"--kv-dropped {self.kv_dropped}: nothing is dropped with --kv-policy {self.kv_policy} "
                              f"at --kv-budget {self.kv_budget:g}; choose a compressing policy and a budget below 1")
        if self.kv_decode == "compress":
            raise ConfigError(f"--kv-dropped {self.kv_dropped} needs --kv-decode keep or lowbit (a compressing decode "
                              "step drops a few tokens at a time, too few to fill a low-bit block)")
        if self.structkv:
            raise ConfigError(f"--kv-dropped {self.kv_dropped}: not supported with --structkv")

    def _check_structkv(self) -> None:
        for flag, ratio in (("--structkv-prefill-ratio", self.structkv_prefill_ratio),
                            ("--structkv-kv-ratio", self.structkv_kv_ratio)):
            if not (0.0 < ratio <= 1.0):
                raise ConfigError(f"{flag}: must be in (0, 1], got {ratio}")
        pivot = self.structkv_pivot
        if pivot != "auto" and (isinstance(pivot, bool) or not isinstance(pivot, int) or pivot < 1):
            raise ConfigError(f"--structkv-pivot: must be 'auto' or a layer index >= 1, got {pivot!r}")
        if self.structkv_mode not in STRUCTKV_MODES:
            raise ConfigError(
                f"--structkv-mode: unknown mode {self.structkv_mode!r}; choose from {', '.join(STRUCTKV_MODES)}"
            )
        if self.structkv_mode != "structkv" and pivot == "auto":
            raise ConfigError(f"--structkv-mode {self.structkv_mode} needs a fixed --structkv-pivot N (a layer index)")
        if self.structkv and self.kv_window < 1:
            raise ConfigError("--kv-window: StructKV keeps a window of at least 1 token in every layer group's KV")
        if isinstance(self.structkv_window, bool) or not isinstance(self.structkv_window, int) \
                or self.structkv_window < 1:
            raise ConfigError(f"--structkv-window: must be at least 1 query, got {self.structkv_window!r}")
        if self.structkv_select not in STRUCTKV_SELECTIONS:
            raise ConfigError(f"--structkv-select: unknown choice {self.structkv_select!r}; "
                              f"choose from {', '.join(STRUCTKV_SELECTIONS)}")
        if self.structkv_kv_score not in STRUCTKV_KV_SCORES:
            raise ConfigError(f"--structkv-kv-score: unknown choice {self.structkv_kv_score!r}; "
                              f"choose from {', '.join(STRUCTKV_KV_SCORES)}")

    def to_dict(self) -> dict:
        """Plain JSON-serializable form (layer groups as their flag text)."""
        data = asdict(self)
        data["kv_layer_groups"] = str(self.kv_layer_groups)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PaskConfig":
        """Inverse of :meth:`to_dict`; raises ConfigError on unknown keys or bad values."""
        unknown = set(data) - {"kv_policy", "kv_budget", "kv_layer_groups", "kv_window", "kv_score_window",
                               "kv_decode", "kv_dropped", "pask_policy", "structkv",
                               "structkv_prefill_ratio", "structkv_kv_ratio", "structkv_pivot", "structkv_mode",
                               "structkv_window", "structkv_select", "structkv_kv_score"}
        if unknown:
            raise ConfigError(f"unknown sglang-pask config keys: {', '.join(sorted(unknown))}")
        return cls(
            kv_policy=str(data.get("kv_policy", "full")),
            kv_budget=float(data.get("kv_budget", 1.0)),
            kv_layer_groups=LayerGroupSpec.parse(str(data.get("kv_layer_groups", "1"))),
            kv_window=int(data.get("kv_window", DEFAULT_KV_WINDOW)),
            kv_score_window=None if data.get("kv_score_window") is None else int(data["kv_score_window"]),
            kv_decode=str(data.get("kv_decode", "compress")),
            kv_dropped=str(data.get("kv_dropped", "drop")),
            pask_policy=data.get("pask_policy"),
            structkv=bool(data.get("structkv", False)),
            structkv_prefill_ratio=float(data.get("structkv_prefill_ratio", DEFAULT_STRUCTKV_PREFILL_RATIO)),
            structkv_kv_ratio=float(data.get("structkv_kv_ratio", DEFAULT_STRUCTKV_KV_RATIO)),
            structkv_pivot=data.get("structkv_pivot", "auto"),
            structkv_mode=str(data.get("structkv_mode", "structkv")),
            structkv_window=int(data.get("structkv_window", DEFAULT_STRUCTKV_WINDOW)),
            structkv_select=str(data.get("structkv_select", DEFAULT_STRUCTKV_SELECT)),
            structkv_kv_score=str(data.get("structkv_kv_score", DEFAULT_STRUCTKV_KV_SCORE)),
        )

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


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not (0.0 < value <= 1.0):
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _whole_number(text: str, expected: str) -> int:
    """``text`` as an int, or an argparse error saying it must be ``expected``."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None


def _window(text: str) -> int:
    value = _whole_number(text, "a whole number of tokens")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def _score_window(text: str) -> int:
    value = _whole_number(text, "a whole number of queries")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _pivot(text: str) -> Union[str, int]:
    if text == "auto":
        return "auto"
    value = _whole_number(text, "'auto' or a layer index >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a layer index >= 1, got {value}")
    return value


def _layer_groups(text: str) -> LayerGroupSpec:
    try:
        return LayerGroupSpec.parse(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--kv-layer-groups: ")) from None


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add this project's flags, as one argument group, to ``parser``."""
    group = parser.add_argument_group("sglang-pask", "KV persistence per layer group (PASK, StructKV)")
    group.add_argument(
        "--kv-policy",
        choices=KV_POLICIES,
        default="full",
        help="Which policy decides the KV each layer group keeps (default: full).",
    )
    group.add_argument(
        "--kv-budget",
        type=_budget,
        default=1.0,
        help="Total KV budget as a fraction of full KV, in (0, 1] (default: 1.0).",
    )
    group.add_argument(
        "--kv-layer-groups",
        type=_layer_groups,
        default=LayerGroupSpec(count=1),
        metavar="N|A-B,C-D,...",
        help="Layer groups: a number of equal contiguous groups, or inclusive layer ranges that cover "
        "all layers, e.g. 0-11,12-23 (default: 1).",
    )
    group.add_argument(
        "--kv-window",
        type=_window,
        default=DEFAULT_KV_WINDOW,
        metavar="TOKENS",
        help=f"Recent window: the newest tokens of a request every layer group keeps (default: {DEFAULT_KV_WINDOW}).",
    )
    group.add_argument(
        "--kv-score-window",
        type=_score_window,
        default=None,
        metavar="QUERIES",
        help="Observation window: how many of the newest queries score the keys for snapkv, pyramidkv and pask "
        "(default: the --kv-window).",
    )
    group.add_argument(
        "--kv-decode",
        choices=KV_DECODE_MODES,
        default="compress",
        help="What decode does with generated tokens: 'compress' (each layer group keeps about its budget of "
        "them, so a request's whole KV stays near the budget), 'keep' (never dropped; the budget applies to "
        "the prompt, as SnapKV defines it) or 'lowbit' (as keep, but those older than --kv-window go to a "
        "low-bit block of the --kv-dropped format each time 32 of them fill one; needs --kv-dropped 2bit or "
        "k4v2) (default: compress).",
    )
    group.add_argument(
        "--kv-dropped",
        choices=KV_DROPPED_MODES,
        default="drop",
        help="What happens to a token a layer group drops: 'drop' (its KV leaves the group), '2bit' (it stays "
        "readable at 2 bits, keys per channel and values per token in blocks of 32 tokens, in the group's own "
        "slots: --kv-budget is then the share kept at full precision, and each dropped token costs 3/16 of a "
        "bf16 slot) or 'k4v2' (the same with keys at 4 bits: 1/4 of a bf16 slot); the low-bit modes need "
        "--kv-decode keep or lowbit and torch_native attention (default: drop).",
    )
    group.add_argument(
        "--pask-policy",
        default=None,
        metavar="FILE",
        help="Calibrated PASK policy file for --kv-policy pask (python -m sglang_pask.calibrate writes one; "
        "default: the file shipped for the served model and --kv-decode mode, if one ships).",
    )
    group.add_argument(
        "--structkv",
        action="store_true",
        help="StructKV prefill pruning: layers up to a pivot see the whole prompt and accumulate centrality, "
        "later layers compute only on the skeleton; each layer group keeps R_KV of the prompt's KV for decode, "
        "where --kv-policy then applies. Disables chunked prefill unless --chunked-prefill-size is given.",
    )
    group.add_argument(
        "--structkv-prefill-ratio",
        type=_budget,
        default=None,
        metavar="R_STRUCT",
        help=f"Skeleton share of the computed prompt part, in (0, 1] (default: {DEFAULT_STRUCTKV_PREFILL_RATIO}).",
    )
    group.add_argument(
        "--structkv-kv-ratio",
        type=_budget,
        default=None,
        metavar="R_KV",
        help=f"Share of the computed prompt part whose KV each layer group keeps, in (0, 1] "
        f"(default: {DEFAULT_STRUCTKV_KV_RATIO}).",
    )
    group.add_argument(
        "--structkv-pivot",
        type=_pivot,
        default=None,
        metavar="auto|N",
        help="Pivot layer: detected per prompt from attention entropy, top-k mass and variance (auto), "
        "or the 0-based layer N (default: auto).",
    )
    group.add_argument(
        "--structkv-mode",
        choices=STRUCTKV_MODES,
        default=None,
        help="structkv (decayed centrality up to the pivot, continue on the skeleton), fixed-pivot "
        "(FastKV-style: the pivot layer's own scores) or gemfilter (layer N's scores, prefill restarts "
        "from layer 0 on the skeleton); the last two need --structkv-pivot N (default: structkv).",
    )
    group.add_argument(
        "--structkv-window",
        type=_score_window,
        default=None,
        metavar="W",
        help="StructKV's observation window: the newest prompt tokens whose queries score the prompt (centrality, "
        f"pivot statistics, the KV each group keeps); the skeleton always holds them (default: {DEFAULT_STRUCTKV_WINDOW}; "
        "the paper uses 8).",
    )
    group.add_argument(
        "--structkv-select",
        choices=STRUCTKV_SELECTIONS,
        default=None,
        help="What the skeleton and each layer group's KV keep set are chosen in: 'segments' (whole sentences and "
        "lines, ranked by their tokens' mean score) or 'tokens' (single tokens, max-pooled over 7 neighbours, as "
        f"the paper) (default: {DEFAULT_STRUCTKV_SELECT}).",
    )
    group.add_argument(
        "--structkv-kv-score",
        choices=STRUCTKV_KV_SCORES,
        default=None,
        help="What ranks the KV each layer group keeps for decode (R_KV of the prompt, among the tokens the group "
        "computed): 'own' (the group's own window scores, as the paper) or 'centrality' (the cross-layer centrality "
        f"the skeleton was chosen from, the same ranking in every group) (default: {DEFAULT_STRUCTKV_KV_SCORE}).",
    )


def from_namespace(args: argparse.Namespace) -> PaskConfig:
    """Build the config from parsed flags (see :func:`add_cli_args`).

    Raises ConfigError when a ``--structkv-*`` flag comes without ``--structkv``.
    """
    structkv_flags = {
        "--structkv-prefill-ratio": args.structkv_prefill_ratio,
        "--structkv-kv-ratio": args.structkv_kv_ratio,
        "--structkv-pivot": args.structkv_pivot,
        "--structkv-mode": args.structkv_mode,
        "--structkv-window": args.structkv_window,
        "--structkv-select": args.structkv_select,
        "--structkv-kv-score": args.structkv_kv_score,
    }
    given = [flag for flag, value in structkv_flags.items() if value is not None]
    if given and not args.structkv:
        raise ConfigError(f"{given[0]} needs --structkv")
    return PaskConfig(
        kv_policy=args.kv_policy,
        kv_budget=args.kv_budget,
        kv_layer_groups=args.kv_layer_groups,
        kv_window=args.kv_window,
        kv_score_window=args.kv_score_window,
        kv_decode=args.kv_decode,
        kv_dropped=args.kv_dropped,
        pask_policy=args.pask_policy,
        structkv=args.structkv,
        structkv_prefill_ratio=_or(args.structkv_prefill_ratio, DEFAULT_STRUCTKV_PREFILL_RATIO),
        structkv_kv_ratio=_or(args.structkv_kv_ratio, DEFAULT_STRUCTKV_KV_RATIO),
        structkv_pivot=_or(args.structkv_pivot, "auto"),
        structkv_mode=_or(args.structkv_mode, "structkv"),
        structkv_window=_or(args.structkv_window, DEFAULT_STRUCTKV_WINDOW),
        structkv_select=_or(args.structkv_select, DEFAULT_STRUCTKV_SELECT),
        structkv_kv_score=_or(args.structkv_kv_score, DEFAULT_STRUCTKV_KV_SCORE),
    )


def _or(value, default):
    return default if value is None else value
