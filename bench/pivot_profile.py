"""Where StructKV's pivot lies on real prompts: per-layer window-attention statistics, offline and online.

For each long-context prompt of :mod:`bench.long_context` (same generator, same seed), the default model
runs once in transformers; every layer's window scores (attention the last ``--window`` queries pay
to each token, summed over heads and queries) are recomputed from that layer's queries and keys
beside its SDPA attention (:class:`WindowScoreRecorder`: only the window's rows, so an 8K prompt
fits in memory, where eager attention's full ``(heads, n, n)`` maps of 24 layers would not). They
give:

- the statistics of :func:`sglang_pask.structkv.pivot.layer_statistics` (entropy, top-k mass,
  variance: ``stats``, one ``[H, rho, V]`` per layer) of the scores of only the newest 8 queries
  (``PivotConfig.statistics_window``), as the server reads them and the transition scores ``T`` of every step
  between layers;
- ``dominance``: :func:`~sglang_pask.structkv.pivot.step_dominance` of each step over all layers;
- the offline pivot ``argmax T + 1`` over every layer (what the paper's formula gives with all layers
  seen);
- the online decision of :class:`sglang_pask.structkv.PromptPruning` with its defaults, fed the layers
  in order as a prefill would: ``(pivot, decided_at)``;
- where the answer lies in the prompt (the needle's digits, the variables' names): how many of its
  tokens the skeleton holds at the decision layer by three scores, each selected three ways (raw
  top-k, the prefill's pooled tokens, the prefill's whole segments: ``skeleton_key_tokens``), and by
  each layer's own scores alone, selected as the server's ``--structkv-select`` (``--select``)
  chooses (``layer_key_tokens``); the first layer that holds every one is where retrieval starts
  (``retrieval_onset``), a pivot below it prunes the answer away.

Usage::

    python -m bench.pivot_profile [--lengths 1024 2048 4096 8192] [--items 4] [--json OUT]

CPU, float32; on 2 cores a 2K prompt takes about 10 s, an 8K one about a minute.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bench.common import run_header
from bench.long_context import TASKS
from sglang_pask.cli_paths import output_file
from sglang_pask.config import STRUCTKV_SELECTIONS, flag_default


class WindowScoreRecorder:
    """Wraps transformers' SDPA attention function: each call also records the window scores.

    ``scores[l]`` ``(n,)`` float32 is ``softmax(q k^T * scaling)`` of the last ``window`` queries of
    the ``l``-th call (causal: query ``n - window + i`` sees keys ``0 .. n - window + i``), summed
    over query heads and those queries: what eager attention's ``attentions[l][0, :, -window:, :]
    .sum((0, 1))`` holds, without the ``(heads, n, n)`` map. Grouped KV heads are repeated to the
    query heads. ``statistics[l]`` is the same over only the last ``statistics_window`` of those
    queries (what the pivot's statistics read online).
    """

    def __init__(self, attention: Callable[..., Any], window: int, statistics_window: int) -> None:
        self.attention = attention
        self.window = window
        self.statistics_window = statistics_window
        self.scores: list[Any] = []
        self.statistics: list[Any] = []

    def __call__(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        import torch

        q = query[0, :, -self.window :, :].float()  # (heads, w, d)
        k = key[0].float().repeat_interleave(q.shape[0] // key.shape[1], dim=0)  # (heads, n, d)
        n, w = k.shape[1], q.shape[1]
        scaling = kwargs.get("scaling") or q.shape[-1] ** -0.5
        logits = (q @ k.transpose(-1, -2)) * scaling  # (heads, w, n)
        future = torch.arange(n)[None, :] > torch.arange(n - w, n)[:, None]  # (w, n)
        weights = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)  # (heads, w, n)
        self.scores.append(weights.sum(dim=(0, 1)))
        self.statistics.append(weights[:, -self.statistics_window :, :].sum(dim=(0, 1)))
        return self.attention(module, query, key, value, attention_mask, **kwargs)


def profile(
    scores_per_layer: list[Any],
    window: int,
    patience: Optional[int] = None,
    dominance: Optional[float] = None,
    key_positions: Optional[list[int]] = None,
    segments: Optional[Any] = None,
    layers_by_segments: bool = True,
    statistics_per_layer: Optional[list[Any]] = None,
) -> dict[str, Any]:
    """Statistics, transition scores, dominance and both pivots of one prompt.

    With ``key_positions``, also how many of them the skeleton (top 20% plus the window) holds at the
    online decision layer ``d``, by three scores (``skeleton_key_tokens``): the centrality summed
    from layer 0 (``from_layer_0``), from the search's first layer as the prefill does
    (``from_search_start``), and layer ``d``'s scores alone (``layer_alone``). Under those names the
    top-k is of the raw scores; under ``<name>_pooled`` it is the prefill's token selection
    (:func:`sglang_pask.structkv.pooled_skeleton`, ``--structkv-select tokens``) and, with
    ``segments``, under ``<name>_segments`` the prefill's default segment selection
    (:func:`sglang_pask.structkv.segment_skeleton`). ``layer_key_tokens`` and ``retrieval_onset``
    use the segment selection when ``segments`` is given and ``layers_by_segments``, the pooled
    token selection otherwise.

    Parameters
    ----------
    scores_per_layer : list of Tensor
        ``num_layers`` tensors ``(n,)`` float: each layer's window scores.
    window : int
        The window the scores came from (the online decision's window).
    patience, dominance : optional
        The online rule's (:class:`sglang_pask.structkv.PromptPruning`); its defaults when None.
    key_positions : list of int, optional
        Token positions a correct answer needs (the needle's or the variables' tokens).
    segments : Tensor, optional
        ``(n,)`` int64 :func:`sglang_pask.structkv.segment_ids` of the prompt's tokens.
    layers_by_segments : bool
        Whether each layer's own skeleton (``layer_key_tokens``) is chosen by ``segments``.
    statistics_per_layer : list of Tensor, optional
        ``num_layers`` tensors ``(n,)``: each layer's scores from the newest queries the pivot's
        statistics read (:attr:`WindowScoreRecorder.statistics`); ``scores_per_layer`` when None.
    """
    import torch

    from sglang_pask.structkv import (
        DEFAULT_DOMINANCE,
        DEFAULT_PATIENCE,
        CentralityAccumulator,
        PivotConfig,
        PromptPruning,
        detect_pivot,
        layer_statistics,
        pooled_skeleton,
        segment_skeleton,
        select_skeleton,
        transition_scores,
    )
    from sglang_pask.structkv.pivot import step_dominance

    statistics_per_layer = statistics_per_layer or scores_per_layer
    stats = torch.stack([layer_statistics(s) for s in statistics_per_layer])
    num_layers = len(scores_per_layer)
    pruning = PromptPruning(
        PivotConfig(),
        num_layers,
        scores_per_layer[0].numel(),
        ratio=0.2,
        window=window,
        patience=DEFAULT_PATIENCE if patience is None else patience,
        dominance=DEFAULT_DOMINANCE if dominance is None else dominance,
    )
    online = None
    for layer, (scores, statistics) in enumerate(zip(scores_per_layer, statistics_per_layer)):
        decision = pruning.observe(layer, scores, statistics)
        if decision is not None:
            online = {"pivot": decision.pivot, "decided_at": decision.decided_at}
            break
    coverage = None
    per_layer = onset = None
    if key_positions is not None:
        keys = set(key_positions)
        by = segments if layers_by_segments else None
        per_layer = [len(keys & set(layer_skeleton(scores, window, by).tolist())) for scores in scores_per_layer]
        onset = next((layer for layer, held in enumerate(per_layer) if held == len(keys)), None)
    if key_positions is not None and online is not None:
        keys, decided = set(key_positions), online["decided_at"]
        coverage = {"key_tokens": len(keys)}
        for name, decay, first in (
            ("from_layer_0", 0.9, 0),
            ("from_search_start", 0.9, pruning.min_pivot),
            ("layer_alone", 0.0, decided),
        ):
            accumulator = CentralityAccumulator(decay, min(first, decided))
            for scores in scores_per_layer[: decided + 1]:
                accumulator.add(scores)
            centrality = accumulator.centrality(decided)
            coverage[name] = len(keys & set(select_skeleton(centrality, 0.2, window).tolist()))
            coverage[f"{name}_pooled"] = len(keys & set(pooled_skeleton(centrality, 0.2, window).tolist()))
            if segments is not None:
                skeleton = segment_skeleton(centrality, segments, 0.2, window)
                coverage[f"{name}_segments"] = len(keys & set(skeleton.tolist()))
    return {
        "stats": stats.tolist(),
        "entropy": [round(x, 3) for x in stats[:, 0].tolist()],
        "topk_mass": [round(x, 3) for x in stats[:, 1].tolist()],
        "transition": [round(x, 3) for x in transition_scores(stats).tolist()],
        "dominance": [round(step_dominance(stats, step), 2) for step in range(num_layers - 1)],
        "offline_pivot": detect_pivot(stats, num_layers),
        "online": online,
        "skeleton_key_tokens": coverage,
        "layer_key_tokens": per_layer,
        "retrieval_onset": onset,
    }


def layer_skeleton(scores: Any, window: int, segments: Optional[Any] = None, ratio: float = 0.2) -> Any:
    """The skeleton one layer's window scores ``(n,)`` would choose on their own, as the prefill
    chooses it from the centrality: by whole segments when ``segments`` (``(n,)`` int64) is given
    (:func:`sglang_pask.structkv.segment_skeleton`), else by pooled tokens
    (:func:`sglang_pask.structkv.pooled_skeleton`); ``(k,)`` int64."""
    from sglang_pask.structkv import pooled_skeleton, segment_skeleton

    if segments is not None:
        return segment_skeleton(scores, segments, ratio, window)
    return pooled_skeleton(scores, ratio, window)


def key_positions(tokenizer: Any, text: str, expected: Sequence[str]) -> list[int]:
    """Positions of the tokens of ``text`` that overlap an occurrence of an expected answer part
    before the question (which follows the last blank line): the needle's digits, the variables'
    names."""
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    body = text[: text.rfind("\n\n")]
    spans = [(m.start(), m.end()) for part in expected for m in re.finditer(re.escape(part), body)]
    return [i for i, (a, b) in enumerate(offsets) if any(a < end and b > start for start, end in spans)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.pivot_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["niah", "vt"],
        choices=TASKS,
        help="tasks of bench.long_context (default: niah vt)",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=[1024, 2048, 4096, 8192],
        help="prompt lengths in tokens (default: 1024 2048 4096 8192)",
    )
    parser.add_argument("--items", type=int, default=4, help="prompts per task and length (default: 4)")
    parser.add_argument(
        "--window",
        type=int,
        default=flag_default("structkv_window"),
        help=f"last-window queries, StructKV's observation window (default: {flag_default('structkv_window')}, "
        "the server's --structkv-window; the paper uses 8)",
    )
    parser.add_argument(
        "--select",
        choices=STRUCTKV_SELECTIONS,
        default="segments",
        help="the selection layer_key_tokens and retrieval_onset use, as the server's --structkv-select "
        "(default: segments); skeleton_key_tokens reports both",
    )
    parser.add_argument(
        "--patience", type=int, default=None, help="the online rule's patience (default: PromptPruning's, 0)"
    )
    parser.add_argument(
        "--dominance", type=float, default=None, help="the online rule's dominance (default: PromptPruning's, 1.3)"
    )
    parser.add_argument("--model-path", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument(
        "--json", type=output_file, default=None, help="write the profiles, command, date, machine and commit here"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from bench.long_context import build_items
    from sglang_pask.default_model import ensure_default_model
    from sglang_pask.structkv import DEFAULT_STATISTICS_WINDOW, segment_end_table, segment_ids
    from sglang_pask.structure import TokenVocab

    model_path = args.model_path or str(ensure_default_model(log=lambda line: print(line, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    vocab = TokenVocab.from_huggingface(tokenizer)
    segment_ends = segment_end_table(vocab.token_bytes, vocab.special_ids)
    recorder = WindowScoreRecorder(ALL_ATTENTION_FUNCTIONS["sdpa"], args.window, DEFAULT_STATISTICS_WINDOW)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = recorder
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    rows = []
    for item in tqdm(build_items(tokenizer, args.tasks, args.lengths, args.items), desc="prompts", file=sys.stderr):
        ids = tokenizer(item.text, return_tensors="pt")["input_ids"]
        recorder.scores.clear()
        recorder.statistics.clear()
        with torch.no_grad():
            model(ids)
        rows.append(
            {
                "task": item.task,
                "length": item.length,
                "index": item.index,
                "tokens": ids.shape[1],
                **profile(
                    list(recorder.scores),
                    args.window,
                    args.patience,
                    args.dominance,
                    key_positions(tokenizer, item.text, item.expected),
                    segment_ids(segment_ends[ids[0]]),
                    args.select == "segments",
                    list(recorder.statistics),
                ),
            }
        )
    for row in rows:
        online = row["online"] or {}
        print(
            f"{row['task']:>4} {row['tokens']:>5} tokens: offline pivot {row['offline_pivot']}, "
            f"online pivot {online.get('pivot')} decided after layer {online.get('decided_at')}"
        )
        print("      T   " + " ".join(f"{x:+.2f}" for x in row["transition"]))
        print("      dom " + " ".join(f"{x:+.1f}" for x in row["dominance"]))
    onsets = [row["retrieval_onset"] for row in rows]
    print(
        f"first layer whose own scores hold every answer token in their top 20% by {args.select} (retrieval onset): "
        + " ".join("-" if onset is None else str(onset) for onset in onsets)
    )
    covered = [row["skeleton_key_tokens"] for row in rows if row["skeleton_key_tokens"]]
    if covered:
        totals = {name: sum(c[name] for c in covered) for name in covered[0]}
        print(
            f"answer tokens in the skeleton (top 20% + window) at the decision layer, of {totals.pop('key_tokens')}: "
            + ", ".join(f"{name} {count}" for name, count in totals.items())
        )
        whole = {name: sum(c[name] == c["key_tokens"] for c in covered) for name in totals}
        print(
            f"prompts whose skeleton holds every answer token, of {len(covered)}: "
            + ", ".join(f"{name} {count}" for name, count in whole.items())
        )
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
