"""KV memory, concurrency and throughput of the layer-group pool, per policy and budget, side by side.

For each configuration (``full`` at 1.0, then every policy at every budget) this starts
``python -m sglang_pask.launch_server`` on the real default model with one fixed KV pool size
(``--max-total-tokens``), sends the same BFCL-like workload all at once (BFCL eval items in BFCL's
prompt format, greedy, EBNF-constrained calls, through ``/generate`` so that each response carries
``meta_info["kv_stats"]``), and measures:

* **KV bytes per request**: at each request's last step, the bytes its layer groups held
  (``sum_g (kept_g + lowbit_slots_g) * bytes_per_slot_g``, the second term the slots of its 2-bit
  blocks under ``--kv-dropped 2bit``), against full KV of the same length; mean over requests;
* **most requests served concurrently**: the peak number of requests holding KV in the pool
  (``/server_info`` -> ``sglang_pask.kv_pool.peak_running_requests``);
* **tokens/s**: generated tokens over the workload's wall time.

With ``--breakdown`` each request also asks for the positions its groups held (``return_kv_kept``),
and a second table shows where a request's slots go, per layer group and request on average: the
prompt tokens matched from the radix cache, the full-precision tokens held in that matched prefix,
in the rest of the prompt and among the generated tokens, and the low-bit tokens with the slots of
their blocks (shared blocks counted whole, as the bytes above count them); a third table shows the
token places of those blocks that are not the request's own: another request's or the cache's
tokens, tokens freed since the block was made, places never filled.

Ratios are against ``full`` from the same run. Prints a table; ``--json`` writes the numbers with
the command, date, machine and commit; ``--plot`` draws KV bytes and concurrency per configuration.

Example::

    python -m bench.memory --limit 48 --max-total-tokens 4096 --json bench/results/memory.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import requests
from tqdm import tqdm

from bench.bfcl import configurations, parse_budgets, select_items
from bench.common import exit_on_sigterm, held_kv_bytes, run_header
from sglang_pask.bfcl.data import AST_CATEGORIES
from sglang_pask.bfcl.grammar import item_ebnf
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.cli_paths import output_file
from sglang_pask.config import KV_DROPPED_MODES, KV_POLICIES
from sglang_pask.kernels.kv_lowbit import BLOCK_TOKENS
from sglang_pask.server_process import ServerProcess

BASELINE_POLICIES = [p for p in KV_POLICIES if p != "full"]


@dataclass
class SlotBreakdown:
    """Where a request's slots go (``--breakdown``): means over requests and layer groups, in tokens
    or slots of one group."""

    tokens: float
    matched_prefix_tokens: float
    full_in_matched_prefix: float
    full_in_rest_of_prompt: float
    full_in_generated: float
    lowbit_tokens: float
    lowbit_slots: float
    lowbit_blocks: float = 0.0
    lowbit_passes: float = 0.0
    places_other_rows: float = 0.0
    places_freed: float = 0.0
    places_never_filled: float = 0.0


@dataclass
class ConfigMemory:
    """What one (policy, budget) configuration measured."""

    policy: str
    budget: float
    requests: int
    kv_bytes_per_request: float
    full_kv_bytes_per_request: float
    kv_fraction: float
    peak_concurrent_requests: int
    peak_group_slots: list[int]
    group_slots: list[int]
    pool_bytes: int
    tokens_per_s: float
    wall_s: float
    breakdown: Optional[SlotBreakdown] = None


def slot_breakdown(results: Sequence[dict]) -> SlotBreakdown:
    """:class:`SlotBreakdown` of responses whose ``kv_stats`` carry ``kept_positions`` (and, under a
    low-bit mode, ``lowbit_positions``, ``lowbit_slots`` and ``lowbit_block_places``)."""
    sums = dict.fromkeys(SlotBreakdown.__dataclass_fields__, 0.0)
    count = 0
    for result in results:
        meta = result["meta_info"]
        stats = meta["kv_stats"]
        cached, prompt = meta.get("cached_tokens", 0), meta["prompt_tokens"]
        groups = len(stats["kept_positions"])
        for g, kept in enumerate(stats["kept_positions"]):
            sums["full_in_matched_prefix"] += sum(1 for p in kept if p < cached)
            sums["full_in_rest_of_prompt"] += sum(1 for p in kept if cached <= p < prompt)
            sums["full_in_generated"] += sum(1 for p in kept if p >= prompt)
            sums["lowbit_tokens"] += len(stats.get("lowbit_positions", [[]] * groups)[g])
            sums["lowbit_slots"] += stats.get("lowbit_slots", [0] * groups)[g]
            places = stats.get("lowbit_block_places", [{}] * groups)[g]
            sums["lowbit_blocks"] += places.get("blocks", 0)
            sums["lowbit_passes"] += places.get("passes", 0)
            sums["places_other_rows"] += places.get("other_rows", 0)
            sums["places_freed"] += places.get("freed", 0)
            sums["places_never_filled"] += places.get("never_filled", 0)
        sums["tokens"] += stats["full_tokens"] * groups
        sums["matched_prefix_tokens"] += cached * groups
        count += groups
    return SlotBreakdown(**{name: total / max(count, 1) for name, total in sums.items()})


def chat_prompt(tokenizer, item) -> str:
    return tokenizer.apply_chat_template(build_messages(item), tokenize=False, add_generation_prompt=True)


def send(url: str, text: str, ebnf: str, max_tokens: int, kept: bool = False) -> dict:
    """One greedy, EBNF-constrained ``/generate`` call; ``kept`` asks for the held positions."""
    sampling = {"temperature": 0, "max_new_tokens": max_tokens, "ebnf": ebnf}
    if kept:
        sampling["return_kv_kept"] = True
    response = requests.post(f"{url}/generate", json={"text": text, "sampling_params": sampling}, timeout=3600)
    response.raise_for_status()
    return response.json()


def server_flags(model_path: str, policy: str, budget: float, args: argparse.Namespace) -> list[str]:
    """Launcher arguments of one configuration: ``--kv-dropped`` for every policy but full,
    ``--pask-policy`` for pask only (the launcher refuses both where they do not apply), and for full
    ``--kv-decode keep`` where ``--server-args`` say ``lowbit`` (full KV drops nothing to store at low
    precision, and the launcher refuses ``lowbit`` without a low-bit ``--kv-dropped``)."""
    extra = shlex.split(args.server_args)
    if policy == "full":
        extra = [
            "keep"
            if i and extra[i - 1] == "--kv-decode" and flag == "lowbit"
            else "--kv-decode=keep"
            if flag == "--kv-decode=lowbit"
            else flag
            for i, flag in enumerate(extra)
        ]
    flags = [
        "--model-path",
        model_path,
        "--kv-policy",
        policy,
        "--kv-budget",
        str(budget),
        "--kv-layer-groups",
        args.layer_groups,
        "--max-total-tokens",
        str(args.max_total_tokens),
        *extra,
    ]
    if policy != "full":
        flags += ["--kv-dropped", args.kv_dropped]
    if policy == "pask" and args.pask_policy is not None:
        flags += ["--pask-policy", args.pask_policy]
    return flags


def run_config(
    model_path: str, policy: str, budget: float, prompts: list[tuple[str, str]], args: argparse.Namespace, log_dir: Path
) -> ConfigMemory:
    """Start a server for (policy, budget), run the workload at once, read the pool's peaks."""
    flags = server_flags(model_path, policy, budget, args)
    with ServerProcess(flags, log_dir / f"{policy}-{budget}.log") as server:
        server.wait_ready(timeout_s=900)
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [
                pool.submit(send, server.url, text, ebnf, args.max_tokens, args.breakdown) for text, ebnf in prompts
            ]
            results = [f.result() for f in tqdm(futures, desc=f"{policy} {budget}", file=sys.stderr)]
        wall = time.perf_counter() - start
        usage = requests.get(f"{server.url}/server_info", timeout=60).json()
        usage = usage["internal_states"][0]["sglang_pask"]["kv_pool"]
    per_token = [group["bytes_per_slot"] for group in usage["groups"]]
    kept_bytes, full_bytes = zip(*(held_kv_bytes(result["meta_info"]["kv_stats"], per_token) for result in results))
    generated = sum(r["meta_info"]["completion_tokens"] for r in results)
    return ConfigMemory(
        policy=policy,
        budget=budget,
        requests=len(results),
        kv_bytes_per_request=sum(kept_bytes) / len(results),
        full_kv_bytes_per_request=sum(full_bytes) / len(results),
        kv_fraction=sum(k / f for k, f in zip(kept_bytes, full_bytes)) / len(results),
        peak_concurrent_requests=usage["peak_running_requests"],
        peak_group_slots=[group["peak_slots_in_use"] for group in usage["groups"]],
        group_slots=[group["slots"] for group in usage["groups"]],
        pool_bytes=usage["bytes"],
        tokens_per_s=generated / wall,
        wall_s=wall,
        breakdown=slot_breakdown(results) if args.breakdown else None,
    )


def format_table(rows: Sequence[ConfigMemory]) -> str:
    full = next((r for r in rows if r.policy == "full"), rows[0])
    lines = [
        "| policy | budget | KV bytes/request | vs full KV | peak concurrent | vs full | tokens/s | vs full |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.policy} | {r.budget:g} | {r.kv_bytes_per_request / 1024:.0f} KiB | {r.kv_fraction:.2f} | "
            f"{r.peak_concurrent_requests} | {r.peak_concurrent_requests / full.peak_concurrent_requests:.2f}x | "
            f"{r.tokens_per_s:.1f} | {r.tokens_per_s / full.tokens_per_s:.2f}x |"
        )
    return "\n".join(lines)


def format_breakdown(rows: Sequence[ConfigMemory]) -> str:
    """``--breakdown``'s table: per request and layer group on average, tokens or slots."""
    lines = [
        "| policy | budget | tokens | matched from cache | full: matched prefix | full: rest of prompt | "
        "full: generated | low-bit tokens | low-bit slots | slots in all | slots / tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = r.breakdown
        if b is None:
            continue
        slots = b.full_in_matched_prefix + b.full_in_rest_of_prompt + b.full_in_generated + b.lowbit_slots
        lines.append(
            f"| {r.policy} | {r.budget:g} | {b.tokens:.1f} | {b.matched_prefix_tokens:.1f} | "
            f"{b.full_in_matched_prefix:.1f} | {b.full_in_rest_of_prompt:.1f} | {b.full_in_generated:.1f} | "
            f"{b.lowbit_tokens:.1f} | {b.lowbit_slots:.1f} | {slots:.1f} | {slots / b.tokens:.3f} |"
        )
    return "\n".join(lines)


def format_block_places(rows: Sequence[ConfigMemory]) -> str:
    """``--breakdown``'s table of the low-bit blocks a request reads, per request and layer group on
    average: blocks, the drop calls that made them, and their token places that are not the request's
    own (another request's or the cache's tokens, freed since, never filled) with the slots they take."""
    lines = [
        "| policy | budget | blocks | made by passes | places: other rows | places: freed | "
        "places: never filled | slots of places not the request's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = r.breakdown
        if b is None or not b.lowbit_blocks:
            continue
        not_own = b.places_other_rows + b.places_freed + b.places_never_filled
        slots_per_place = b.lowbit_slots / (b.lowbit_blocks * BLOCK_TOKENS)
        lines.append(
            f"| {r.policy} | {r.budget:g} | {b.lowbit_blocks:.1f} | {b.lowbit_passes:.2f} | "
            f"{b.places_other_rows:.1f} | {b.places_freed:.1f} | {b.places_never_filled:.1f} | "
            f"{not_own * slots_per_place:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: Sequence[ConfigMemory], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.policy}\n{r.budget:g}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for axis, values, title in (
        (axes[0], [r.kv_fraction for r in rows], "KV bytes per request / full KV"),
        (axes[1], [r.peak_concurrent_requests for r in rows], "peak concurrent requests"),
        (axes[2], [r.tokens_per_s for r in rows], "generated tokens/s"),
    ):
        axis.bar(labels, values)
        axis.set_title(title)
        axis.tick_params(axis="x", labelsize=7, labelrotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--policies",
        nargs="+",
        default=BASELINE_POLICIES,
        choices=BASELINE_POLICIES,
        help="policies besides full (default: all)",
    )
    parser.add_argument("--budgets", nargs="+", default=["0.33", "0.2"], help="budgets in (0, 1) (default: 0.33 0.2)")
    parser.add_argument("--limit", type=int, default=48, help="BFCL eval items in the workload (default: 48)")
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=4096,
        help="the fixed KV pool size in tokens, the same for every configuration (default: 4096)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length cap (default: 128)")
    parser.add_argument("--layer-groups", default="4", help="--kv-layer-groups for the servers (default: 4)")
    parser.add_argument("--model-path", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument(
        "--server-args",
        default="--chunked-prefill-size 512",
        help="extra server flags for every configuration, one quoted string (default: "
        "'--chunked-prefill-size 512', so that one prefill pass cannot fill the small pool)",
    )
    parser.add_argument(
        "--kv-dropped",
        choices=KV_DROPPED_MODES,
        default="drop",
        help="--kv-dropped for every configuration but full (2bit needs --kv-decode keep in "
        "--server-args) (default: drop)",
    )
    parser.add_argument(
        "--pask-policy",
        metavar="JSON",
        default=None,
        help="--pask-policy for the pask configurations (default: the shipped policy)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also show where each request's slots go (matched prefix, prompt, generated, "
        "low-bit blocks); the requests ask for their held positions",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="write results and run details to this JSON file"
    )
    parser.add_argument("--plot", type=output_file, default=None, help="write a bar chart to this PNG file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    budgets = parse_budgets(args.budgets)
    from transformers import AutoTokenizer

    from sglang_pask.default_model import ensure_default_model

    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    per_category = -(-args.limit // len(AST_CATEGORIES))
    items = select_items(AST_CATEGORIES, "eval", None, per_category)[: args.limit]
    prompts = [(chat_prompt(tokenizer, item), item_ebnf(item)) for item in items]
    configs = [("full", 1.0)] + [c for c in configurations(args.policies, budgets) if c[0] != "full"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as log_dir:
        for policy, budget in configs:
            rows.append(run_config(model_path, policy, budget, prompts, args, Path(log_dir)))
            print(format_table(rows), file=sys.stderr)
    table = format_table(rows)
    if args.breakdown:
        table += "\n\n" + format_breakdown(rows) + "\n\n" + format_block_places(rows)
    print(table)
    if args.json:
        record = {
            **run_header("python -m bench.memory", argv),
            "model": model_path,
            "workload": {
                "items": len(items),
                "max_tokens": args.max_tokens,
                "grammar": "ebnf",
                "max_total_tokens": args.max_total_tokens,
                "layer_groups": args.layer_groups,
                "kv_dropped": args.kv_dropped,
                "pask_policy": args.pask_policy,
            },
            "results": [asdict(r) for r in rows],
            "table": table,
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
