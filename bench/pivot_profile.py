"""Where StructKV's pivot lies on real prompts: per-layer window-attention statistics, offline and online.

For each long-context prompt of :mod:`bench.long_context` (same generator, same seed), the default model
runs once in transformers with eager attention; every layer's window scores (attention the last
``--window`` queries pay to each token, summed over heads and queries) give:

- the statistics of :func:`sglang_pask.structkv.pivot.layer_statistics` (entropy, top-k mass) and the
  transition scores ``T`` of every step between layers;
- ``dominance``: :func:`~sglang_pask.structkv.pivot.step_dominance` of each step over all layers;
- the offline pivot ``argmax T + 1`` over every layer (what the paper's formula gives with all layers
  seen);
- the online decision of :class:`sglang_pask.structkv.PromptPruning` with its defaults, fed the layers
  in order as a prefill would: ``(pivot, decided_at)``.

Usage::

    python -m bench.pivot_profile [--lengths 1024 2048] [--items 2] [--json OUT]

CPU, float32; a 2K prompt takes about 10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.common import run_header


def profile(scores_per_layer: list[Any], window: int) -> dict[str, Any]:
    """Statistics, transition scores, dominance and both pivots of one prompt.

    Parameters
    ----------
    scores_per_layer : list of Tensor
        ``num_layers`` tensors ``(n,)`` float: each layer's window scores.
    window : int
        The window the scores came from (the online decision's window).
    """
    import torch

    from sglang_pask.structkv import PivotConfig, PromptPruning, detect_pivot, layer_statistics, transition_scores
    from sglang_pask.structkv.pivot import step_dominance

    stats = torch.stack([layer_statistics(s) for s in scores_per_layer])
    num_layers = len(scores_per_layer)
    pruning = PromptPruning(PivotConfig(), num_layers, scores_per_layer[0].numel(), ratio=0.2, window=window)
    online = None
    for layer, scores in enumerate(scores_per_layer):
        decision = pruning.observe(layer, scores)
        if decision is not None:
            online = {"pivot": decision.pivot, "decided_at": decision.decided_at}
            break
    return {
        "entropy": [round(x, 3) for x in stats[:, 0].tolist()],
        "topk_mass": [round(x, 3) for x in stats[:, 1].tolist()],
        "transition": [round(x, 3) for x in transition_scores(stats).tolist()],
        "dominance": [round(step_dominance(stats, step), 2) for step in range(num_layers - 1)],
        "offline_pivot": detect_pivot(stats, num_layers),
        "online": online,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.pivot_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["niah", "vt"], choices=["niah", "vt"], help="tasks")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048], help="prompt lengths in tokens")
    parser.add_argument("--items", type=int, default=2, help="prompts per task and length")
    parser.add_argument("--window", type=int, default=8, help="last-window queries (StructKV's w)")
    parser.add_argument("--model-path", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--json", default=None, help="write the profiles, command, date, machine and commit here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.long_context import build_items
    from sglang_pask.default_model import ensure_default_model

    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager").eval()
    rows = []
    for item in tqdm(build_items(tokenizer, args.tasks, args.lengths, args.items), desc="prompts", file=sys.stderr):
        ids = tokenizer(item.text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions  # per layer (1, heads, n, n)
        scores = [a[0, :, -args.window:, :].sum(dim=(0, 1)).float() for a in attentions]
        rows.append({"task": item.task, "length": item.length, "index": item.index, "tokens": ids.shape[1],
                     **profile(scores, args.window)})
    for row in rows:
        online = row["online"] or {}
        print(f"{row['task']:>4} {row['tokens']:>5} tokens: offline pivot {row['offline_pivot']}, "
              f"online pivot {online.get('pivot')} decided after layer {online.get('decided_at')}")
        print("      T   " + " ".join(f"{x:+.2f}" for x in row["transition"]))
        print("      dom " + " ".join(f"{x:+.1f}" for x in row["dominance"]))
    if args.json:
        record = {
            **run_header("python -m bench.pivot_profile", argv),
            "model": model_path,
            "profiles": rows,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
