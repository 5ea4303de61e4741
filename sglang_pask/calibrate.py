"""``python -m sglang_pask.calibrate``: calibrate a PASK policy file on BFCL's calibration split.

It starts ``python -m sglang_pask.launch_server`` with full KV (``--kv-policy full``, the radix cache
off so that no request reads another's prompt) and the layer groups to calibrate, then:

1. **Baseline:** every calibration item (BFCL prompt format, greedy, EBNF-constrained call list)
   with full KV; its AST verdict, its tokens' roles (``return_kv_roles``) and, per layer group, the
   attention-output distortion of keeping a ``--budget`` score-ordered subset of the prompt
   (probe ``distortion_budget``).
2. **Task-error sensitivity**, measured on the *sensitivity items*: those full KV answers correctly
   (every item if it answers none). The sensitivity of a probe is the share of them whose answer it
   turns incorrect.

   * Screening: every role with at least ``--min-role-share`` of the tokens is dropped in every layer
     group at once (probe ``drop_group: "all"``): ``s_all[r]``.
   * Per group: each role with ``s_all[r] > 0`` is dropped in one group at a time, everything else
     kept (probe ``drop_group: g``): ``s[g, r]``. A role that only hurts when every group drops it
     (``s[g, r] = 0`` for all ``g``) gets ``s[g, r] = s_all[r] / num_groups`` in every group.
     Roles the screening found harmless are not probed per group: ``s[g, r] = 0``.
3. **Policy:**

   * residual shares: ``share_g`` proportional to ``L_g * distortion_g`` (groups whose attention output
     moves most when compressed get more of the budget);
   * floors, per group, as a knapsack: roles in decreasing order of sensitivity per token
     (``s[g, r] / frequency_r``) get floor 1 while the protected share of tokens (by the calibration
     data's role frequencies) stays within ``--max-protected-share`` of the group's budget; the first
     role that does not fit gets the floor that fills it exactly, later ones 0.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_pask.config import DEFAULT_KV_WINDOW, LayerGroupSpec

PROG = "python -m sglang_pask.calibrate"
# Probe answers may run this many tokens past the item's full-KV answer (see main()).
PROBE_ANSWER_MARGIN = 8


@dataclass
class ItemRun:
    """One calibration item answered under one probe."""

    item_id: str
    valid: bool
    roles: list[str]
    distortion: Optional[list[float]]
    answer_tokens: int


def floors_from_sensitivity(sensitivity: list[list[float]], frequencies: list[float], budgets: list[float],
                            max_protected_share: float = 0.6) -> list[list[float]]:
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
    """Per-group sensitivities, with joint-only roles spread over the groups (module docstring, step 2).

    Parameters
    ----------
    per_group : list[list[float]]
        ``(num_groups, num_roles)`` sensitivity of dropping a role in one group.
    joint : list[float]
        ``(num_roles,)`` sensitivity of dropping a role in every group at once.

    Returns
    -------
    list[list[float]]
        ``(num_groups, num_roles)``: ``per_group``, except that a role with ``joint > 0`` and zero
        sensitivity in every group gets ``joint / num_groups`` in each.
    """
    groups = len(per_group)
    spread = [list(row) for row in per_group]
    for role, together in enumerate(joint):
        if together > 0 and all(row[role] <= 0 for row in per_group):
            for row in spread:
                row[role] = together / groups
    return spread


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
    parser.add_argument("--out", default="pask_policy.json", help="policy file to write (default: pask_policy.json)")
    parser.add_argument("--kv-layer-groups", default="4", help="layer groups to calibrate (default: 4)")
    parser.add_argument("--budget", type=float, default=0.33,
                        help="total KV budget the distortion is measured at and the floors must fit (default: 0.33)")
    parser.add_argument("--kv-window", type=int, default=DEFAULT_KV_WINDOW,
                        help=f"recent window, as the server will use it (default: {DEFAULT_KV_WINDOW})")
    parser.add_argument("--limit", type=int, default=None,
                        help="use this many calibration items (spread over the categories; default: all)")
    parser.add_argument("--min-role-share", type=float, default=0.002,
                        help="probe only roles with at least this share of the tokens (default: 0.002)")
    parser.add_argument("--max-protected-share", type=float, default=0.6,
                        help="floors protect at most this share of a group's budget (default: 0.6)")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length cap (default: 128)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: 4)")
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
    if args.limit is not None and args.limit < 1:
        _fail(f"--limit must be at least 1, got {args.limit}")
    try:
        groups_spec = LayerGroupSpec.parse(args.kv_layer_groups)
    except ValueError as err:
        _fail(str(err))

    import requests
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sglang_pask.bfcl.checker import check
    from sglang_pask.bfcl.data import AST_CATEGORIES, load_items
    from sglang_pask.bfcl.grammar import item_ebnf
    from sglang_pask.bfcl.prompt import build_messages
    from sglang_pask.bfcl.split import split_items
    from sglang_pask.default_model import ensure_default_model
    from sglang_pask.policy.pask import PaskTable
    from sglang_pask.policy.pask_file import save_policy_file, table_to_json
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
    prompts = {item.id: tokenizer.apply_chat_template(build_messages(item), tokenize=False, add_generation_prompt=True)
               for item in items}
    started = time.time()
    flags = ["--model-path", model_path, "--kv-policy", "full", "--kv-layer-groups", str(groups_spec),
             "--kv-window", str(args.kv_window), "--disable-radix-cache", *shlex.split(args.server_args)]
    log_path = Path(tempfile.mkdtemp(prefix="sglang-pask-calibrate-")) / "server.log"
    print(f"server log: {log_path}", file=sys.stderr)
    answer_cap: dict[str, int] = {}
    with ServerProcess(flags, log_path) as server:
        server.wait_ready(timeout_s=900)

        def run(item: Any, probe: dict) -> ItemRun:
            body = {"text": prompts[item.id], "sampling_params": {
                "temperature": 0, "max_new_tokens": answer_cap.get(item.id, args.max_tokens), "ebnf": item_ebnf(item),
                "return_kv_roles": True, "custom_params": {"pask_probe": probe}}}
            response = requests.post(f"{server.url}/generate", json=body, timeout=3600)
            response.raise_for_status()
            data = response.json()
            meta = data["meta_info"]
            return ItemRun(item.id, check(item, data["text"]).valid, meta["kv_prompt_roles"] + meta["kv_roles"],
                           meta["kv_stats"].get("distortion"), meta["completion_tokens"])

        def run_all(probe: dict, bar: Any, subset: Sequence[Any]) -> list[ItemRun]:
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                futures = [pool.submit(run, item, probe) for item in subset]
                results = []
                for future in futures:
                    results.append(future.result())
                    bar.update(1)
            return results

        def error_rate(probe: dict, bar: Any) -> float:
            """Share of the sensitivity items whose answer the probe turns incorrect."""
            runs = run_all(probe, bar, sensitivity_items)
            return sum(baseline_valid[r.item_id] and not r.valid for r in runs) / len(runs)

        with tqdm(total=len(items), desc="baseline (full KV)", file=sys.stderr) as bar:
            base = run_all({"distortion_budget": args.budget}, bar, items)
        baseline_valid = {r.item_id: r.valid for r in base}
        # A probe's answer gets the room of the full-KV answer plus a margin: an answer that runs
        # past it is almost surely wrong, and runaway answers would otherwise dominate the time.
        answer_cap.update({r.item_id: min(args.max_tokens, r.answer_tokens + PROBE_ANSWER_MARGIN) for r in base})
        sensitivity_items = [item for item in items if baseline_valid[item.id]] or items
        counts = Counter(label for run_ in base for label in run_.roles)
        total = sum(counts.values())
        frequencies = [counts.get(role.label, 0) / total for role in Role]
        probed = [role for role in Role if frequencies[role] >= args.min_role_share]
        accuracy_full = sum(r.valid for r in base) / len(base)
        joint = [0.0] * len(Role)
        with tqdm(total=len(sensitivity_items) * len(probed), desc="screening (role in every group)",
                  file=sys.stderr) as bar:
            for role in probed:
                joint[role] = error_rate({"drop_group": "all", "drop_role": role.label}, bar)
        sensitive = [role for role in probed if joint[role] > 0]
        per_group = [[0.0] * len(Role) for _ in ranges]
        with tqdm(total=len(sensitivity_items) * len(sensitive) * len(ranges), desc="sensitivity (group, role)",
                  file=sys.stderr) as bar:
            for g in range(len(ranges)):
                for role in sensitive:
                    per_group[g][role] = error_rate({"drop_group": g, "drop_role": role.label}, bar)
    distortion = [sum(r.distortion[g] for r in base) / len(base) for g in range(len(ranges))]
    layers = [len(r) for r in ranges]
    shares = shares_from_distortion(distortion, layers)
    sensitivity = spread_joint_sensitivity(per_group, joint)
    probe_table = PaskTable(floors=tuple(tuple(0.0 for _ in Role) for _ in ranges), residual_shares=tuple(shares),
                            layers_per_group=tuple(layers), role_frequencies=tuple(frequencies))
    budgets = probe_table.group_budgets(args.budget)
    floors = floors_from_sensitivity(sensitivity, frequencies, budgets, args.max_protected_share)
    table = PaskTable(floors=tuple(tuple(row) for row in floors), residual_shares=tuple(shares),
                      layers_per_group=tuple(layers), role_frequencies=tuple(frequencies))
    calibration = {
        "command": PROG + " " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": "calib",
        "items": [item.id for item in items],
        "budget": args.budget,
        "window": args.kv_window,
        "max_tokens": args.max_tokens,
        "probe_answer_margin": PROBE_ANSWER_MARGIN,
        "grammar": "ebnf",
        "accuracy_full": accuracy_full,
        "sensitivity_items": [item.id for item in sensitivity_items],
        "error_rate_dropped_everywhere": {role.label: joint[role] for role in probed},
        "error_rate_dropped": {f"{g}:{role.label}": per_group[g][role] for g in range(len(ranges))
                               for role in sensitive},
        "max_protected_share": args.max_protected_share,
        "distortion": distortion,
        "probed_roles": [role.label for role in probed],
        "elapsed_s": round(time.time() - started, 1),
    }
    save_policy_file(args.out, table_to_json(table, Path(model_path).name, ranges, calibration))
    print(f"wrote {args.out}: full-KV accuracy {accuracy_full:.3f} on {len(items)} items, "
          f"{len(probed)} roles screened, {len(sensitive)} x {len(ranges)} groups probed, shares {[round(s, 3) for s in shares]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
