"""``python -m sglang_pask.calibrate``: calibrate a PASK policy file on BFCL's calibration split.

It starts ``python -m sglang_pask.launch_server`` with full KV (``--kv-policy full``, the radix cache
off so that no request reads another's prompt) and the layer groups to calibrate, then:

1. **Baseline:** every calibration item (BFCL prompt format, greedy, EBNF-constrained call list)
   with full KV; its AST verdict, its tokens' roles (``return_kv_roles``) and, per layer group, the
   attention-output distortion of keeping a ``--budget`` score-ordered subset of the prompt
   (probe ``distortion_budget``).
2. **Task-error sensitivity**, measured on the *sensitivity items*: those full KV answers correctly
   (every item if it answers none). The sensitivity of a probe is the share of them whose answer it
   turns incorrect. ``--sensitivity-per-category K`` keeps at most K of them per BFCL category
   (spread evenly over the category's correct items), so that categories full KV rarely answers
   correctly, such as the multi-call ones, weigh as much as the abundant single-call ones.

   * Screening: every role with at least ``--min-role-share`` of the tokens is dropped in every layer
     group at once (probe ``drop_group: "all"``): ``s_all[r]``.
   * Per group: each role with ``s_all[r] > 0`` is dropped in one group at a time, everything else
     kept (probe ``drop_group: g``): ``s[g, r]``. Every group then carries at least an even share of
     the joint sensitivity, ``s[g, r] = max(s[g, r], s_all[r] / num_groups)``: online every group
     compresses at once, and with few items a group's own probe often measures 0 (the other groups
     still hold the role) where dropping it everywhere does not.
     Roles the screening found harmless are not probed per group: ``s[g, r] = 0``.
   * With ``--kv-dropped 2bit|k4v2``, the same two stages again with each role kept as its low-bit
     round trip instead of dropped (probe ``lowbit``): ``q[g, r]``; then one probe that stores every
     token at low bits in every group (``drop_role: "all"``): ``q_all``. The per-role ``q[g, r]``
     (a few flips of single items) are scaled so that they sum to ``q_all`` (see
     :func:`tiered_policy_table`). ``--reuse FILE`` takes the rates a file measured on the same items.
3. **Policy:**

   * residual shares: ``share_g`` proportional to ``L_g * distortion_g`` (groups whose attention output
     moves most when compressed get more of the budget);
   * floors, per group, as a knapsack: roles in decreasing order of sensitivity per token
     (``s[g, r] / frequency_r``) get floor 1 while the protected share of tokens (by the calibration
     data's role frequencies) stays within ``--max-protected-share`` of the group's budget; the first
     role that does not fit gets the floor that fills it exactly, later ones 0.
   * the frequencies are those of the tokens the server will compress (``--kv-decode``, as the
     server's flag): with ``compress``, prompt and answer tokens; with ``keep``, the prompt's only.
     Under ``keep`` an answer role costs nothing to protect (decode drops no answer token), so it
     takes no room from the prompt roles.

``--refit FILE`` recomputes the floors and shares of an existing policy file from the measurements it
records (sensitivities, distortion, items), for another ``--budget``, ``--max-protected-share`` or
``--kv-decode``, without a server and in seconds. Under ``keep`` it tags the recorded items' prompts
offline with the function the server uses (:func:`~sglang_pask.structure.tag_prompt_ids`); the
distortion stays the one measured at the source's budget (recorded as ``distortion_budget``). A role
the source's file does not list (one added to the vocabulary after it was calibrated, see
:data:`~sglang_pask.structure.roles.REFINES`) was measured as part of the role it refines: its tokens
are counted as that role and it gets that role's floors.

The file (:mod:`sglang_pask.policy.pask_file`) records the model, the groups, the floors, the
shares, the role frequencies and everything measured, with the command, date and items. Calibration
items never overlap evaluation items: they come from the fixed calibration split
(``sglang_pask/bfcl/calibration_ids.txt``).
"""

from __future__ import annotations

import argparse
import math
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from sglang_pask.bfcl.constraints import CONSTRAINTS
from sglang_pask.cli_paths import output_file
from sglang_pask.config import KV_DROPPED_MODES, POLICY_DECODE_MODES, LayerGroupSpec, flag_default

if TYPE_CHECKING:
    from sglang_pask.policy.pask import PaskTable
    from sglang_pask.policy.pask_file import Tiers

PROG = "python -m sglang_pask.calibrate"
# Probe answers may run this many tokens past the item's full-KV answer (see main()).
PROBE_ANSWER_MARGIN = 8


@dataclass
class ItemRun:
    """One calibration item answered under one probe."""

    item_id: str
    valid: bool
    prompt_roles: list[str]
    answer_roles: list[str]
    distortion: Optional[list[float]]
    answer_tokens: int


def role_shares(counts: Counter) -> list[float]:
    """``(NUM_ROLES,)`` share of each role (by :class:`Role` value) in ``counts`` (role label -> count)."""
    from sglang_pask.structure.roles import Role

    total = sum(counts.values())
    return [counts.get(role.label, 0) / total if total else 0.0 for role in Role]


def balance_by_category(items: Sequence[Any], per_category: Optional[int]) -> list[Any]:
    """At most ``per_category`` of ``items`` from each category, spread evenly over its items.

    Parameters
    ----------
    items : sequence
        Items with a ``category`` attribute, in the order to sample from.
    per_category : int or None
        The cap per category; None keeps every item.

    Returns
    -------
    list
        The chosen items, in their order in ``items``.
    """
    if per_category is None:
        return list(items)
    positions: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        positions.setdefault(item.category, []).append(position)
    chosen = {
        group[i * len(group) // min(per_category, len(group))]
        for group in positions.values()
        for i in range(min(per_category, len(group)))
    }
    return [items[position] for position in sorted(chosen)]


def floors_from_sensitivity(
    sensitivity: list[list[float]], frequencies: list[float], budgets: list[float], max_protected_share: float = 0.6
) -> list[list[float]]:
    """Floors from task-error sensitivity: a knapsack per group (module docstring, step 3).

    Parameters
    ----------
    sensitivity : list[list[float]]
        ``(num_groups, num_roles)`` task-error sensitivities, >= 0.
    frequencies : list[float]
        ``(num_roles,)`` role shares of the tokens.
    budgets : list[float]
        ``(num_groups,)`` group budgets.
    max_protected_share : float
        Floors may protect at most this share of a group's budget.

    Returns
    -------
    list[list[float]]
        ``(num_groups, num_roles)`` floors in [0, 1]: 1 for the roles with the most sensitivity per
        token, one partial floor where the limit falls, 0 for the rest and for harmless roles.
    """
    floors = []
    for row, budget in zip(sensitivity, budgets):
        room = max_protected_share * budget
        floor_row = [0.0] * len(row)
        sensitive = [r for r, s in enumerate(row) if s > 0]
        by_density = sorted(sensitive, key=lambda r: -row[r] / frequencies[r] if frequencies[r] > 0 else -math.inf)
        for role in by_density:
            cost = frequencies[role]
            if cost <= room:
                floor_row[role], room = 1.0, room - cost
            else:
                floor_row[role], room = room / cost, 0.0
                break
        floors.append(floor_row)
    return floors


def spread_joint_sensitivity(per_group: list[list[float]], joint: list[float]) -> list[list[float]]:
    """Per-group sensitivities, each at least an even share of the joint one (module docstring, step 2).

    Parameters
    ----------
    per_group : list[list[float]]
        ``(num_groups, num_roles)`` sensitivity of dropping a role in one group.
    joint : list[float]
        ``(num_roles,)`` sensitivity of dropping a role in every group at once.

    Returns
    -------
    list[list[float]]
        ``(num_groups, num_roles)``: ``max(per_group[g][r], joint[r] / num_groups)``.
    """
    groups = len(per_group)
    return [[max(s, together / groups) for s, together in zip(row, joint)] for row in per_group]


def scale_to_total(rates: list[list[float]], shares: list[list[float]], total: float) -> list[list[float]]:
    """Rates scaled so that they sum to ``total`` over the pairs with a positive share.

    Parameters
    ----------
    rates : list[list[float]]
        ``(num_groups, num_roles)`` error rates, >= 0.
    shares : list[list[float]]
        ``(num_groups, num_roles)``: each pair's share of the KV bytes (0 for roles absent from the prompt).
    total : float
        The rate of the pairs all together, >= 0.

    Returns
    -------
    list[list[float]]
        ``(num_groups, num_roles)``; if every rate is 0, ``total`` spread in proportion to ``shares``.
    """
    present = sum(r for row, share_row in zip(rates, shares) for r, s in zip(row, share_row) if s > 0)
    if present > 0:
        return [[r * total / present if s > 0 else 0.0 for r, s in zip(row, sr)] for row, sr in zip(rates, shares)]
    weight = sum(s for row in shares for s in row)
    return [[total * s / weight if weight > 0 else 0.0 for s in row] for row in shares]


def shares_from_distortion(distortion: list[float], layers_per_group: list[int]) -> list[float]:
    """Residual shares proportional to ``L_g * distortion_g`` (uniform by layers if all are zero)."""
    weights = [max(d, 0.0) * n for d, n in zip(distortion, layers_per_group)]
    total = sum(weights)
    if total <= 0:
        total_layers = sum(layers_per_group)
        return [n / total_layers for n in layers_per_group]
    return [w / total for w in weights]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument(
        "--out", type=output_file, default="pask_policy.json", help="policy file to write (default: pask_policy.json)"
    )
    parser.add_argument("--kv-layer-groups", default="4", help="layer groups to calibrate (default: 4)")
    parser.add_argument(
        "--budget",
        type=float,
        default=0.33,
        help="total KV budget the distortion is measured at and the floors must fit (default: 0.33)",
    )
    parser.add_argument(
        "--kv-window",
        type=int,
        default=flag_default("kv_window"),
        help=f"recent window, as the server will use it (default: {flag_default('kv_window')})",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="use this many calibration items (spread over the categories; default: all)",
    )
    parser.add_argument(
        "--sensitivity-per-category",
        type=int,
        default=None,
        metavar="K",
        help="measure sensitivity on at most K of the items full KV answers correctly per category "
        "(default: all of them)",
    )
    parser.add_argument(
        "--min-role-share",
        type=float,
        default=0.002,
        help="probe only roles with at least this share of the tokens (default: 0.002)",
    )
    parser.add_argument(
        "--max-protected-share",
        type=float,
        default=0.6,
        help="floors protect at most this share of a group's budget (default: 0.6)",
    )
    parser.add_argument(
        "--sinks",
        type=int,
        default=0,
        metavar="N",
        help="the policy keeps the first N positions of every prompt (attention sinks, as "
        "streaming-llm's 4) on top of the budget; written into the file (default: 0)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length cap (default: 128)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: 4)")
    parser.add_argument(
        "--kv-decode",
        choices=POLICY_DECODE_MODES,
        default="compress",
        help="the server's --kv-decode the policy is for: 'keep' fits the floors to the prompt's "
        "roles only, and serves --kv-decode lowbit too (default: compress)",
    )
    parser.add_argument(
        "--kv-dropped",
        choices=KV_DROPPED_MODES,
        default="drop",
        help="the low-bit format whose tier to measure besides eviction (2bit, k4v2: each role is also probed "
        "kept at low bits), as the server's flag; drop measures eviction only (default: drop)",
    )
    parser.add_argument(
        "--reuse",
        metavar="POLICY",
        default=None,
        help="take the sensitivities POLICY records (a file calibrated on the same items, grammar, --kv-decode, "
        "model and layer groups) instead of measuring them again: its eviction rates, and its per-role low-bit "
        "rates if measured in this --kv-dropped format; only the rest is measured",
    )
    parser.add_argument(
        "--kv-bytes",
        type=float,
        default=None,
        metavar="FRACTION",
        help="solve a tiered policy for this share of full KV's bytes (needs low-bit measurements: "
        "--kv-dropped 2bit|k4v2 here or in the --refit source); default: an untiered policy at --budget",
    )
    parser.add_argument(
        "--tier-residual",
        type=float,
        default=0.02,
        metavar="FRACTION",
        help="with --kv-bytes: the share of the prompt every layer group keeps in full by score on top of the "
        "tiers (default: 0.02)",
    )
    parser.add_argument(
        "--refit",
        metavar="POLICY",
        default=None,
        help="recompute floors and shares from the measurements recorded in POLICY (no server)",
    )
    parser.add_argument(
        "--grammar",
        choices=CONSTRAINTS,
        default=None,
        help="answer constraint, as the bench's --grammar: ebnf-strict enforces the function docs "
        "as strict tools (default: ebnf; --refit keeps its source's and refuses another)",
    )
    parser.add_argument("--server-args", default="", help="extra server flags, one quoted string")
    return parser


def _fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the calibration server is stopped with us.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not 0 < args.budget < 1:
        _fail(f"--budget must be in (0, 1), got {args.budget}")
    if not 0 < args.max_protected_share <= 1:
        _fail(f"--max-protected-share must be in (0, 1], got {args.max_protected_share}")
    if args.sinks < 0:
        _fail(f"--sinks must be 0 or more, got {args.sinks}")
    if args.kv_bytes is not None and not 0 < args.kv_bytes <= 1:
        _fail(f"--kv-bytes must be in (0, 1], got {args.kv_bytes}")
    if not 0 <= args.tier_residual < 1:
        _fail(f"--tier-residual must be in [0, 1), got {args.tier_residual}")
    if args.reuse is not None and (args.refit is not None or args.kv_dropped == "drop"):
        _fail("--reuse measures the low-bit tier only: it needs --kv-dropped 2bit or k4v2, and no --refit")
    if args.kv_bytes is not None and args.refit is None and args.kv_dropped == "drop":
        _fail("--kv-bytes solves three tiers: measure the low-bit one with --kv-dropped 2bit or k4v2")
    if args.limit is not None and args.limit < 1:
        _fail(f"--limit must be at least 1, got {args.limit}")
    if args.sensitivity_per_category is not None and args.sensitivity_per_category < 1:
        _fail(f"--sensitivity-per-category must be at least 1, got {args.sensitivity_per_category}")
    try:
        groups_spec = LayerGroupSpec.parse(args.kv_layer_groups)
    except ValueError as err:
        _fail(str(err))
    if args.refit is not None:
        measuring_only = [
            flag
            for flag, value in (
                ("--limit", args.limit),
                ("--sensitivity-per-category", args.sensitivity_per_category),
                ("--server-args", args.server_args or None),
            )
            if value is not None
        ]
        if measuring_only:
            _fail(
                f"--refit measures nothing, so {', '.join(measuring_only)} would have no effect (calibrate again "
                f"without --refit to use it)"
            )
        return refit(args, argv)
    grammar = args.grammar or "ebnf"

    import requests
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sglang_pask.api.probe import ALL_GROUPS_LABEL, ALL_ROLES_LABEL
    from sglang_pask.bfcl.checker import check
    from sglang_pask.bfcl.constraints import answer_constraint
    from sglang_pask.bfcl.data import AST_CATEGORIES, load_items
    from sglang_pask.bfcl.prompt import build_messages
    from sglang_pask.bfcl.split import split_items
    from sglang_pask.default_model import ensure_default_model
    from sglang_pask.policy.pask_file import save_policy_file, table_to_json
    from sglang_pask.request_pool import request_pool
    from sglang_pask.server_process import ServerProcess
    from sglang_pask.structure.roles import Role

    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    import json

    num_layers = int(json.loads((Path(model_path) / "config.json").read_text())["num_hidden_layers"])
    ranges = groups_spec.resolve(num_layers)
    items = split_items(load_items(AST_CATEGORIES), "calib")
    if args.limit is not None:
        items = [items[i * len(items) // args.limit] for i in range(min(args.limit, len(items)))]
    prompts = {
        item.id: tokenizer.apply_chat_template(build_messages(item), tokenize=False, add_generation_prompt=True)
        for item in items
    }
    reused = None
    if args.reuse is not None:
        try:
            reused = recorded_rates(
                args.reuse,
                [item.id for item in items],
                grammar,
                args.kv_decode,
                Path(model_path).name,
                len(ranges),
                args.kv_dropped,
            )
        except ValueError as err:
            _fail(f"--reuse {args.reuse}: {err}")
    started = time.time()
    flags = [
        "--model-path",
        model_path,
        "--kv-policy",
        "full",
        "--kv-layer-groups",
        str(groups_spec),
        "--kv-window",
        str(args.kv_window),
        "--kv-decode",
        args.kv_decode,
        "--disable-radix-cache",
        *shlex.split(args.server_args),
    ]
    log_path = Path(tempfile.mkdtemp(prefix="sglang-pask-calibrate-")) / "server.log"
    print(f"server log: {log_path}", file=sys.stderr)
    answer_cap: dict[str, int] = {}
    with ServerProcess(flags, log_path) as server:
        server.wait_ready(timeout_s=900)

        def run(item: Any, probe: dict) -> ItemRun:
            body = {
                "text": prompts[item.id],
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": answer_cap.get(item.id, args.max_tokens),
                    **answer_constraint(item, grammar),
                    "return_kv_roles": True,
                    "custom_params": {"pask_probe": probe},
                },
            }
            response = requests.post(f"{server.url}/generate", json=body, timeout=3600)
            response.raise_for_status()
            data = response.json()
            meta = data["meta_info"]
            return ItemRun(
                item.id,
                check(item, data["text"]).valid,
                meta["kv_prompt_roles"],
                meta["kv_roles"],
                meta["kv_stats"].get("distortion"),
                meta["completion_tokens"],
            )

        def run_all(probes: Sequence[dict], bar: Any, subset: Sequence[Any]) -> list[list[ItemRun]]:
            """Every item of ``subset`` under every probe, all in one queue (no probe waits for the
            last item of the one before); ``(len(probes), len(subset))`` runs."""
            with request_pool(args.concurrency) as pool:
                futures = [[pool.submit(run, item, probe) for item in subset] for probe in probes]
                for row in futures:
                    for future in row:
                        future.add_done_callback(lambda done: done.cancelled() or bar.update(1))
                return [[future.result() for future in row] for row in futures]

        def error_rates(probes: Sequence[dict], bar: Any) -> list[float]:
            """Per probe, the share of the sensitivity items whose answer it turns incorrect."""
            return [
                sum(baseline_valid[r.item_id] and not r.valid for r in runs) / len(runs)
                for runs in run_all(probes, bar, sensitivity_items)
            ]

        with tqdm(total=len(items), desc="baseline (full KV)", file=sys.stderr) as bar:
            base = run_all([{"distortion_budget": args.budget}], bar, items)[0]
        baseline_valid = {r.item_id: r.valid for r in base}
        # A probe's answer gets the room of the full-KV answer plus a margin: an answer that runs
        # past it is almost surely wrong, and runaway answers would otherwise dominate the time.
        answer_cap.update({r.item_id: min(args.max_tokens, r.answer_tokens + PROBE_ANSWER_MARGIN) for r in base})
        sensitivity_items = balance_by_category(
            [item for item in items if baseline_valid[item.id]] or items, args.sensitivity_per_category
        )
        prompt_counts = Counter(label for run_ in base for label in run_.prompt_roles)
        all_counts = prompt_counts + Counter(label for run_ in base for label in run_.answer_roles)
        frequencies_by_mode = {"compress": role_shares(all_counts), "keep": role_shares(prompt_counts)}
        # Only roles the server will compress are probed: under keep, no answer role.
        probed = [role for role in Role if frequencies_by_mode[args.kv_decode][role] >= args.min_role_share]
        accuracy_full = sum(r.valid for r in base) / len(base)

        def sensitivities(tier: dict, what: str) -> tuple[list[float], list[list[float]]]:
            """Screening, then per group: the error rates of the probed roles under probes with ``tier``
            added (``{}`` drops the role, ``{"lowbit": format}`` keeps it at low bits)."""
            joint = [0.0] * len(Role)
            with tqdm(
                total=len(sensitivity_items) * len(probed), desc=f"screening ({what}, every group)", file=sys.stderr
            ) as bar:
                probes = [{"drop_group": "all", "drop_role": role.label, **tier} for role in probed]
                for role, rate in zip(probed, error_rates(probes, bar)):
                    joint[role] = rate
            sensitive = [role for role in probed if joint[role] > 0]
            per_group = [[0.0] * len(Role) for _ in ranges]
            with tqdm(
                total=len(sensitivity_items) * len(sensitive) * len(ranges),
                desc=f"sensitivity ({what}, group, role)",
                file=sys.stderr,
            ) as bar:
                pairs = [(g, role) for g in range(len(ranges)) for role in sensitive]
                probes = [{"drop_group": g, "drop_role": role.label, **tier} for g, role in pairs]
                for (g, role), rate in zip(pairs, error_rates(probes, bar)):
                    per_group[g][role] = rate
            return joint, per_group

        if reused is not None and reused.sensitivity_items not in (None, [item.id for item in sensitivity_items]):
            _fail(
                f"--reuse {args.reuse}: its rates were measured on other sensitivity items than this baseline "
                "answers correctly, so they cannot be combined with new ones"
            )
        if reused is None:
            joint, per_group = sensitivities({}, "dropped")
        else:
            per_group, joint = reused.dropped
        lowbit_joint, lowbit_per_group, lowbit_all_roles = None, None, None
        if args.kv_dropped != "drop":
            if reused is not None and reused.lowbit is not None:
                lowbit_per_group, lowbit_joint = reused.lowbit
            else:
                lowbit_joint, lowbit_per_group = sensitivities({"lowbit": args.kv_dropped}, args.kv_dropped)
            with tqdm(total=len(sensitivity_items), desc=f"{args.kv_dropped} on every token", file=sys.stderr) as bar:
                every_token = {"drop_group": ALL_GROUPS_LABEL, "drop_role": ALL_ROLES_LABEL, "lowbit": args.kv_dropped}
                lowbit_all_roles = error_rates([every_token], bar)[0]
    distortion = [sum(r.distortion[g] for r in base) / len(base) for g in range(len(ranges))]
    layers = [len(r) for r in ranges]
    calibration = {
        "command": _command_line(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": "calib",
        "items": [item.id for item in items],
        "budget": args.budget,
        "distortion_budget": args.budget,
        "kv_decode": args.kv_decode,
        "window": args.kv_window,
        "max_tokens": args.max_tokens,
        "probe_answer_margin": PROBE_ANSWER_MARGIN,
        "grammar": grammar,
        "accuracy_full": accuracy_full,
        "sensitivity_per_category": args.sensitivity_per_category,
        "sensitivity_items": [item.id for item in sensitivity_items],
        "error_rate_dropped_everywhere": {role.label: joint[role] for role in probed},
        "error_rate_dropped": _by_group_and_role(per_group, joint),
        **({"reused_from": reused.provenance} if reused is not None else {}),
        **(
            {
                "lowbit_format": args.kv_dropped,
                "error_rate_lowbit_everywhere": {role.label: lowbit_joint[role] for role in probed},
                "error_rate_lowbit": _by_group_and_role(lowbit_per_group, lowbit_joint),
                "error_rate_lowbit_all_roles": lowbit_all_roles,
            }
            if lowbit_joint is not None and lowbit_per_group is not None
            else {}
        ),
        "max_protected_share": args.max_protected_share,
        "distortion": distortion,
        "probed_roles": [role.label for role in probed],
        "role_frequencies_by_decode_mode": {
            mode: dict(zip((r.label for r in Role), shares)) for mode, shares in frequencies_by_mode.items()
        },
        "elapsed_s": round(time.time() - started, 1),
    }
    frequencies = frequencies_by_mode[args.kv_decode]
    tiers = None
    if args.kv_bytes is not None and lowbit_joint is not None and lowbit_per_group is not None:
        table, tiers = tiered_policy_table(
            (per_group, joint), (lowbit_per_group, lowbit_joint), layers, frequencies, args, calibration
        )
    else:
        table = policy_table(per_group, joint, distortion, layers, frequencies, args.budget, args.max_protected_share)
    save_policy_file(
        args.out, table_to_json(replace(table, sinks=args.sinks), Path(model_path).name, ranges, calibration, tiers)
    )
    print(
        f"wrote {args.out}: full-KV accuracy {accuracy_full:.3f} on {len(items)} items, "
        f"{len(probed)} roles screened, {sum(rate > 0 for rate in joint)} x {len(ranges)} groups probed, "
        f"shares {[round(x, 3) for x in table.residual_shares]}"
    )
    return 0


def tiered_policy_table(
    dropped: tuple[list[list[float]], list[float]],
    lowbit: tuple[list[list[float]], list[float]],
    layers: list[int],
    frequencies: list[float],
    args: argparse.Namespace,
    calibration: dict[str, Any],
) -> tuple["PaskTable", "Tiers"]:
    """The tiered table for ``args.kv_bytes`` from the measured sensitivities (:mod:`sglang_pask.policy.knapsack`).

    Parameters
    ----------
    dropped, lowbit : tuple
        ``(per_group, joint)`` sensitivities of evicting a role and of keeping it at low bits:
        ``(num_groups, NUM_ROLES)`` and ``(NUM_ROLES,)``; each group's is at least an even share of the
        joint one (:func:`spread_joint_sensitivity`). The low-bit ones are then scaled to sum to the
        rate measured with every token at low bits, ``calibration["error_rate_lowbit_all_roles"]``
        (:func:`scale_to_total`): the per-role probes flip one or two items each, and added up as
        independent errors they would predict that uniform low-bit storage, which loses about nothing,
        loses many answers. Last, each is capped at the eviction one (a low-bit token carries what an
        evicted one does and more).
    layers, frequencies
        Layers per group; the role shares of the prompt tokens.
    args : argparse.Namespace
        ``kv_bytes``, ``kv_dropped`` (the low-bit format), ``tier_residual``.
    calibration : dict
        The file's calibration record; the solution's tiers, predicted bytes and error are added to it.

    Each group keeps its full tier's share plus the residual in full: its budget, from which the
    residual shares follow (proportional to ``L_g * b_g``).
    """
    from sglang_pask.kv_bytes import lowbit_cost
    from sglang_pask.policy.knapsack import FULL, LOWBIT, solve_tiers
    from sglang_pask.policy.pask import PaskTable
    from sglang_pask.policy.pask_file import Tiers

    fmt = calibration.get("lowbit_format", args.kv_dropped)
    every_token = calibration.get("error_rate_lowbit_all_roles")
    if every_token is None:
        _fail(
            "the low-bit tier's measurements lack the probe of every token at low bits (error_rate_lowbit_all_roles); "
            "calibrate again with --kv-dropped and --reuse of this file, which measures only that"
        )
    if isinstance(every_token, bool) or not isinstance(every_token, (int, float)) or not 0 <= every_token <= 1:
        _fail(f"error_rate_lowbit_all_roles must be a rate in [0, 1], got {every_token!r}")
    evicting = spread_joint_sensitivity(*dropped)
    shares = [[n / sum(layers) * p for p in frequencies] for n in layers]
    scaled = scale_to_total(spread_joint_sensitivity(*lowbit), shares, float(every_token))
    # A token kept at low bits carries what an evicted one carries and more, so keeping it cannot be
    # expected to cost more answers than evicting it; a higher rate is the noise of a few items.
    storing = [[min(low, gone) for low, gone in zip(row_low, row_gone)] for row_low, row_gone in zip(scaled, evicting)]
    try:
        solution = solve_tiers(
            evicting,
            storing,
            layers,
            frequencies,
            args.kv_bytes,
            lowbit_cost(fmt, 2),
            args.tier_residual,
        )
    except ValueError as err:
        _fail(f"--kv-bytes {args.kv_bytes:g}: {err}")
    budgets = [share + args.tier_residual for share in solution.full_shares]
    weights = [b * n for b, n in zip(budgets, layers)]
    table = PaskTable(
        floors=tuple(tuple(1.0 if tier == FULL else 0.0 for tier in row) for row in solution.tiers),
        lowbit=tuple(tuple(1.0 if tier == LOWBIT else 0.0 for tier in row) for row in solution.tiers),
        residual_shares=tuple(w / sum(weights) for w in weights),
        layers_per_group=tuple(layers),
        role_frequencies=tuple(frequencies),
    )
    calibration.update(
        {
            "kv_bytes": args.kv_bytes,
            "tier_residual": args.tier_residual,
            "tier_predicted_bytes": solution.bytes,
            "tier_predicted_error": solution.error,
        }
    )
    kv_budget = sum(weights) / sum(layers)
    return table, Tiers(lowbit_format=fmt, kv_bytes=args.kv_bytes, kv_budget=kv_budget)


def read_rates(
    calibration: dict[str, Any], everywhere_key: str, per_group_key: str, num_groups: int
) -> tuple[list[list[float]], list[float]]:
    """``(per_group, joint)`` error rates recorded in a policy file's calibration: ``(num_groups,
    NUM_ROLES)`` from ``calibration[per_group_key]`` (``"g:role"`` keys) and ``(NUM_ROLES,)`` from
    ``calibration[everywhere_key]`` (role keys); unrecorded pairs are 0.

    Raises
    ------
    KeyError, ValueError, IndexError
        If the entries are missing or malformed.
    """
    from sglang_pask.structure.roles import Role

    joint = [0.0] * len(Role)
    for label, rate in calibration[everywhere_key].items():
        joint[Role.from_label(label)] = float(rate)
    per_group = [[0.0] * len(Role) for _ in range(num_groups)]
    for key, rate in calibration[per_group_key].items():
        group, label = key.split(":", 1)
        per_group[int(group)][Role.from_label(label)] = float(rate)
    return per_group, joint


@dataclass(frozen=True)
class RecordedRates:
    """The sensitivities a policy file records, for ``--reuse``.

    Attributes
    ----------
    dropped : tuple
        ``(per_group, joint)`` eviction rates: ``(num_groups, NUM_ROLES)`` and ``(NUM_ROLES,)``.
    lowbit : tuple or None
        ``(per_group, joint)`` per-role low-bit rates in the wanted format, if the file measured them.
    sensitivity_items : list[str] or None
        The items the rates were measured on, as the file records them.
    provenance : dict
        The file, its command and date, and which rates are reused.
    """

    dropped: tuple[list[list[float]], list[float]]
    lowbit: Optional[tuple[list[list[float]], list[float]]]
    sensitivity_items: Optional[list[str]]
    provenance: dict[str, Any]


def recorded_rates(
    path: str, item_ids: list[str], grammar: str, kv_decode: str, model_name: str, num_groups: int, lowbit_format: str
) -> RecordedRates:
    """The sensitivities a policy file records (:class:`RecordedRates`), checked to come from the same
    items, grammar, decode mode, model and group count; its low-bit rates only if they were measured in
    ``lowbit_format``.

    Raises
    ------
    ValueError
        Naming what does not match, or why the file cannot be read.
    """
    import json

    try:
        source = json.loads(Path(path).read_text())
        calibration = source["calibration"]
        dropped = read_rates(calibration, "error_rate_dropped_everywhere", "error_rate_dropped", num_groups)
        lowbit = None
        if calibration.get("lowbit_format") == lowbit_format:
            lowbit = read_rates(calibration, "error_rate_lowbit_everywhere", "error_rate_lowbit", num_groups)
    except OSError as err:
        raise ValueError(f"cannot read it ({err.strerror})") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise ValueError(f"not a calibrated policy file ({type(err).__name__}: {err})") from None
    found = {
        "items": calibration.get("items"),
        "grammar": calibration.get("grammar", "ebnf"),
        "kv_decode": calibration.get("kv_decode", "compress"),
        "model": source.get("model", {}).get("name"),
        "layer groups": len(source.get("layer_groups", [])),
    }
    wanted = {
        "items": item_ids,
        "grammar": grammar,
        "kv_decode": kv_decode,
        "model": model_name,
        "layer groups": num_groups,
    }
    differ = [name for name in wanted if found[name] != wanted[name]]
    if differ:
        raise ValueError(f"measured with other {', '.join(differ)} than this calibration")
    provenance = {
        "file": str(path),
        "command": calibration.get("command"),
        "date": calibration.get("date"),
        "reused": ["dropped"] + ([f"lowbit {lowbit_format} per role"] if lowbit is not None else []),
        **{key: calibration[key] for key in ("dropped_from", "reused_from") if key in calibration},
    }
    return RecordedRates(dropped, lowbit, calibration.get("sensitivity_items"), provenance)


def _by_group_and_role(per_group: list[list[float]], joint: list[float]) -> dict[str, float]:
    """``{"g:role": rate}`` of a ``(num_groups, NUM_ROLES)`` table, for the roles probed per group (those
    whose screening rate ``joint`` is above 0)."""
    from sglang_pask.structure.roles import Role

    return {f"{g}:{role.label}": row[role] for g, row in enumerate(per_group) for role in Role if joint[role] > 0}


def _command_line(argv: Optional[Sequence[str]]) -> str:
    return PROG + " " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


def policy_table(
    per_group: list[list[float]],
    joint: list[float],
    distortion: list[float],
    layers: list[int],
    frequencies: list[float],
    budget: float,
    max_protected_share: float,
) -> "PaskTable":
    """The PASK table from the measurements (module docstring, step 3).

    Parameters
    ----------
    per_group : list[list[float]]
        ``(num_groups, NUM_ROLES)`` sensitivity of dropping a role in one group.
    joint : list[float]
        ``(NUM_ROLES,)`` sensitivity of dropping a role in every group.
    distortion : list[float]
        ``(num_groups,)`` attention-output distortion.
    layers : list[int]
        ``(num_groups,)`` layers per group.
    frequencies : list[float]
        ``(NUM_ROLES,)`` role shares of the tokens the server compresses (``--kv-decode``).
    budget, max_protected_share : float
        The total budget the floors must fit, and their limit within a group's budget.
    """
    from sglang_pask.policy.pask import PaskTable

    shares = shares_from_distortion(distortion, layers)
    zero = tuple(tuple(0.0 for _ in frequencies) for _ in layers)
    budgets = PaskTable(
        floors=zero, residual_shares=tuple(shares), layers_per_group=tuple(layers), role_frequencies=tuple(frequencies)
    ).group_budgets(budget)
    floors = floors_from_sensitivity(
        spread_joint_sensitivity(per_group, joint), frequencies, budgets, max_protected_share
    )
    return PaskTable(
        floors=tuple(tuple(row) for row in floors),
        residual_shares=tuple(shares),
        layers_per_group=tuple(layers),
        role_frequencies=tuple(frequencies),
    )


def prompt_role_shares(item_ids: Sequence[str], model_path: str) -> list[float]:
    """``(NUM_ROLES,)`` role shares of the BFCL prompts of ``item_ids``, tagged as the server tags them."""
    from transformers import AutoTokenizer

    from sglang_pask.bfcl.data import AST_CATEGORIES, load_items
    from sglang_pask.bfcl.prompt import build_messages
    from sglang_pask.structure import TokenVocab, tag_prompt_ids
    from sglang_pask.structure.roles import LABELS

    by_id = {item.id: item for item in load_items(AST_CATEGORIES)}
    missing = [i for i in item_ids if i not in by_id]
    if missing:
        raise ValueError(f"the recorded calibration items {missing[:3]} are not in the BFCL data")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot load the tokenizer of {model_path} ({type(err).__name__})") from None
    vocab = TokenVocab.from_huggingface(tokenizer)
    counts: Counter = Counter()
    for item_id in item_ids:
        # As the calibration and the benchmark send it: chat-template text, tokenized by the server.
        text = tokenizer.apply_chat_template(build_messages(by_id[item_id]), tokenize=False, add_generation_prompt=True)
        counts.update(LABELS[r] for r in tag_prompt_ids(tokenizer.encode(text), vocab))
    return role_shares(counts)


def refit(args: argparse.Namespace, argv: Optional[Sequence[str]]) -> int:
    """``--refit``: floors and shares recomputed from a policy file's recorded measurements."""
    import json

    from sglang_pask.default_model import ensure_default_model
    from sglang_pask.policy.pask_file import save_policy_file, table_to_json
    from sglang_pask.structure.roles import REFINES, Role

    try:
        source = json.loads(Path(args.refit).read_text())
        calibration = dict(source["calibration"])
        ranges = [range(int(a), int(b) + 1) for a, b in source["layer_groups"]]
        layers = [len(r) for r in ranges]
        per_group, joint = read_rates(calibration, "error_rate_dropped_everywhere", "error_rate_dropped", len(ranges))
        distortion = [float(d) for d in calibration["distortion"]]
        lowbit = None
        if "error_rate_lowbit_everywhere" in calibration:
            lowbit = read_rates(calibration, "error_rate_lowbit_everywhere", "error_rate_lowbit", len(ranges))
        recorded = calibration.get("role_frequencies_by_decode_mode", {})
        source_mode = calibration.get("kv_decode", "compress")
        if source_mode not in recorded:
            recorded[source_mode] = source["role_frequencies"]
    except OSError as err:
        _fail(f"--refit {args.refit}: cannot read it ({err.strerror})")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        _fail(f"--refit {args.refit}: not a calibrated policy file ({type(err).__name__}: {err})")
    source_grammar = calibration.get("grammar", "ebnf")
    if args.grammar is not None and args.grammar != source_grammar:
        _fail(
            f"--refit {args.refit}: its measurements were taken under --grammar {source_grammar}; a refit cannot "
            f"change the grammar (calibrate again with --grammar {args.grammar})"
        )
    if len(distortion) != len(layers) or len(per_group) != len(layers):
        _fail(f"--refit {args.refit}: its distortion lists {len(distortion)} groups, its layer groups {len(layers)}")
    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    if Path(model_path).name != source.get("model", {}).get("name"):
        _fail(
            f"--refit {args.refit}: calibrated for model {source.get('model', {}).get('name')!r}, "
            f"not {Path(model_path).name!r}"
        )
    if args.kv_decode in recorded:
        frequencies = [float(recorded[args.kv_decode].get(role.label, 0.0)) for role in Role]
    elif args.kv_decode == "keep":
        try:
            frequencies = prompt_role_shares(list(calibration.get("items") or []), model_path)
        except ValueError as err:
            _fail(f"--refit {args.refit}: cannot tag its calibration prompts: {err}")
    else:
        _fail(
            f"--refit {args.refit}: calibrated with --kv-decode {source_mode}; its answer-token roles were not "
            f"recorded, so it cannot be refitted for --kv-decode compress (calibrate again)"
        )
    unmeasured = [role for role in REFINES if role.label not in source.get("roles", ())]
    for role in unmeasured:  # counted as the role it refines, as when the source was calibrated
        frequencies[REFINES[role]] += frequencies[role]
        frequencies[role] = 0.0
    tiers = None
    if args.kv_bytes is not None:
        if lowbit is None:
            _fail(
                f"--refit {args.refit}: it has no low-bit measurements, so it cannot be solved for --kv-bytes "
                "(calibrate again with --kv-dropped 2bit or k4v2)"
            )
        if args.kv_dropped not in ("drop", calibration.get("lowbit_format")):
            _fail(
                f"--refit {args.refit}: its low-bit tier was measured as {calibration.get('lowbit_format')}, "
                f"not --kv-dropped {args.kv_dropped}"
            )
        table, tiers = tiered_policy_table((per_group, joint), lowbit, layers, frequencies, args, calibration)
    else:
        table = policy_table(per_group, joint, distortion, layers, frequencies, args.budget, args.max_protected_share)
    if unmeasured:
        floors = [list(row) for row in table.floors]
        lowbit_rows = [list(row) for row in table.lowbit] if table.lowbit is not None else None
        for g, row in enumerate(floors):
            for role in unmeasured:
                row[role] = row[REFINES[role]]
                if lowbit_rows is not None:
                    lowbit_rows[g][role] = lowbit_rows[g][REFINES[role]]
        table = replace(
            table,
            floors=tuple(tuple(row) for row in floors),
            lowbit=tuple(tuple(row) for row in lowbit_rows) if lowbit_rows is not None else None,
        )
    calibration.update(
        {
            "refit_of": {
                "file": str(args.refit),
                "command": calibration.get("command"),
                "date": calibration.get("date"),
            },
            "command": _command_line(argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "budget": args.budget,
            "distortion_budget": calibration.get("distortion_budget", calibration.get("budget")),
            "kv_decode": args.kv_decode,
            "max_protected_share": args.max_protected_share,
        }
    )
    calibration["role_frequencies_by_decode_mode"] = {
        **{mode: dict(shares) for mode, shares in recorded.items()},
        args.kv_decode: dict(zip((r.label for r in Role), frequencies)),
    }
    save_policy_file(
        args.out, table_to_json(replace(table, sinks=args.sinks), source["model"]["name"], ranges, calibration, tiers)
    )
    target = f"--kv-bytes {args.kv_bytes}" if tiers is not None else f"budget {args.budget}"
    print(
        f"wrote {args.out}: refitted from {args.refit} for --kv-decode {args.kv_decode}, {target}, "
        f"max protected share {args.max_protected_share}, sinks {args.sinks}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
