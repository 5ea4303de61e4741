"""One-off: what share of a 2K prompt's KV the multi-value essay prompts need for decode, with the
prefill out of the question.

Each prompt gets a full prefill in transformers (float32, SDPA) that also records every layer's
per-head window scores (the last 32 queries, as StructKV's online scores). The first answer token
comes from that prefill, as in the server; every later token is decoded greedily with each layer
seeing only the prompt positions its rule keeps (plus every generated token). Rules:

- ``full``: every position (full KV);
- ``sum``: R_KV 0.1 by the layer's scores summed over heads, chosen by segments
  (:func:`sglang_pask.structkv.segment_kv_keep`, window 8): what StructKV keeps per layer;
- ``max``: the same with the maximum over heads instead of the sum;
- ``sum02``: ``sum`` at R_KV 0.2;
- ``full_early`` / ``full_late``: every position in layers 0-11 / 12-23, ``sum`` in the others;
- ``shiftX``: the same total as ``sum``, R_KV X in layers 0-11 and 0.2 - X in layers 12-23;
- ``evenoddX``: the same total, R_KV X in even layers and 0.2 - X in odd ones;
- ``segmax`` / ``segtop3`` (added 2026-12-05): ``sum``, with the segments ranked by their best
  token's score / the mean of their best three instead of their mean (short segments such as a lone
  newline rank high by the mean);
- ``tokens`` (added 2026-12-05): R_KV 0.1 by single tokens, scores max-pooled over 7 neighbours
  (:func:`sglang_pask.structkv.prefill.kv_keep`, StructKV's ``--structkv-select tokens``).
- ``sum_zerov`` / ``sum_mean`` / ``sum_segmean`` (added 2026-12-06): ``sum``'s kept set, with the
  dropped positions left visible but changed in the cache: their values zeroed, keys kept (the
  softmax's denominator as in full KV, the dropped content gone); their keys and values replaced by
  their mean over all of the layer's dropped positions (per KV head: one merged token weighted by
  the count it stands for); or by their mean within each segment (one merged token per segment).
- ``sum_needles`` (added 2026-12-06, an oracle): ``sum``'s kept set plus, in every layer, the whole
  segments that hold a needle (a segment naming "magic" and an expected value).
- ``cent`` (added 2026-12-06): every layer keeps R_KV 0.1 by segments of the same scores, StructKV's
  centrality at pivot 11 (``sum_{8 <= l <= 11} 0.9^(11 - l)`` of the layers' summed scores).

    PYTHONPATH=. .venv/bin/python bench/results/structkv_kv_share_2k_2026-12-04/sim_decode.py niah-mv 2048 6 full,sum,max [-v]
"""
import copy
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from bench.long_context import ANSWER_TOKENS, build_items, is_correct
from sglang_pask.default_model import ensure_default_model
from sglang_pask.structkv import segment_end_table, segment_ids, segment_kv_keep
from sglang_pask.structkv.prefill import kv_keep
from sglang_pask.structkv.skeleton import top_count
from sglang_pask.structure import TokenVocab

WINDOW_QUERIES = 32
tasks, length, items = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
rules = sys.argv[4].split(",")
verbose = "-v" in sys.argv
model_path = str(ensure_default_model())
tokenizer = AutoTokenizer.from_pretrained(model_path)
vocab = TokenVocab.from_huggingface(tokenizer)
end_table = segment_end_table(vocab.token_bytes, vocab.special_ids)
sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
state = {"scores": [], "masks": None, "prompt": 0, "needles": None}


def attention(module, query, key, value, attention_mask, **kwargs):
    """Prefill: record ``(heads, n)`` window scores. Decode: hide the prompt positions not kept."""
    if query.shape[2] > 1:
        q = query[0, :, -WINDOW_QUERIES:, :].float()
        k = key[0].float().repeat_interleave(q.shape[0] // key.shape[1], dim=0)
        n, w = k.shape[1], q.shape[1]
        scaling = kwargs.get("scaling") or q.shape[-1] ** -0.5
        future = torch.arange(n)[None, :] > torch.arange(n - w, n)[:, None]
        weights = torch.softmax(((q @ k.transpose(-1, -2)) * scaling).masked_fill(future, float("-inf")), -1)
        state["scores"].append(weights.sum(1))
    elif state["masks"] is not None:
        allow = torch.ones(key.shape[2], dtype=torch.bool)
        allow[: state["prompt"]] = state["masks"][module.layer_idx]
        attention_mask = allow[None, None, None, :]
    return sdpa(module, query, key, value, attention_mask, **kwargs)


ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
num_layers = model.config.num_hidden_layers
half = num_layers // 2


def by_segment_peaks(scores: torch.Tensor, segments: torch.Tensor, ratio: float, how: str) -> torch.Tensor:
    """As ``segment_kv_keep`` over every position (window 8 first, whole segments, the last one cut),
    the segments ranked by their best token's score (``max``) or their best three's mean (``top3``)."""
    n, count = scores.numel(), top_count(ratio, scores.numel()) + 8
    num_segments = int(segments.max()) + 1
    if how == "max":
        value = torch.full((num_segments,), -1.0).scatter_reduce(0, segments, scores, "amax")
    else:
        value = torch.stack([scores[segments == s].topk(min(3, int((segments == s).sum()))).values.mean()
                             for s in range(num_segments)])
    rank = torch.empty(num_segments, dtype=torch.int64)
    rank[torch.sort(value, descending=True, stable=True).indices] = torch.arange(num_segments)
    rank = rank[segments].masked_fill(torch.arange(n) >= n - 8, -1)
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.sort(rank[order], stable=True).indices]
    return order[: min(n, count)].sort().values


def kept(heads: torch.Tensor, segments: torch.Tensor, rule: str) -> torch.Tensor:
    """``(layers, n)`` bool: the prompt positions each layer keeps under ``rule``."""
    n = heads.shape[-1]
    every = torch.arange(n)

    def by_segments(scores, ratio):
        return segment_kv_keep(scores, every, segments, ratio, 8)

    masks = torch.zeros(num_layers, n, dtype=torch.bool)
    for layer in range(num_layers):
        summed = heads[layer].sum(0)
        if rule == "full":
            keep = every
        elif rule == "sum":
            keep = by_segments(summed, 0.1)
        elif rule in ("segmax", "segtop3"):
            keep = by_segment_peaks(summed, segments, 0.1, rule[3:])
        elif rule == "tokens":
            keep = kv_keep(summed, every, 0.1, 8)
        elif rule == "sum_needles":
            keep = torch.cat([by_segments(summed, 0.1), state["needles"]])
        elif rule == "cent":
            weights = [0.9 ** (11 - l) for l in range(8, 12)]
            keep = by_segments(sum(w * heads[l].sum(0) for w, l in zip(weights, range(8, 12))), 0.1)
        elif rule == "sum02":
            keep = by_segments(summed, 0.2)
        elif rule == "max":
            keep = by_segments(heads[layer].max(0).values, 0.1)
        elif rule == "full_early":
            keep = every if layer < half else by_segments(summed, 0.1)
        elif rule == "full_late":
            keep = by_segments(summed, 0.1) if layer < half else every
        elif rule.startswith("shift"):
            low = float(rule[5:])
            keep = by_segments(summed, low if layer < half else 0.2 - low)
        elif rule.startswith("evenodd"):
            low = float(rule[7:])
            keep = by_segments(summed, 0.2 - low if layer % 2 else low)
        else:
            raise SystemExit(f"unknown rule {rule!r}")
        masks[layer, keep] = True
    return masks


def merge_dropped(cache, masks: torch.Tensor, segments: torch.Tensor, how: str) -> None:
    """Rewrite, in place, each layer's dropped prompt positions (``~masks[layer]``) in ``cache``:
    values zeroed (``zerov``), or keys and values set to their mean over the layer's dropped
    positions (``mean``) or over each segment's dropped positions (``segmean``)."""
    for layer, entry in enumerate(cache.layers):
        dropped = (~masks[layer]).nonzero().flatten()
        if dropped.numel() == 0:
            continue
        keys, values = entry.keys[0], entry.values[0]  # (kv_heads, seq, dim)
        if how == "zerov":
            values[:, dropped] = 0
            continue
        groups = torch.zeros_like(dropped) if how == "mean" else segments[dropped]
        for tensor in (keys, values):
            part = tensor[:, dropped]  # (kv_heads, d, dim)
            sums = torch.zeros(tensor.shape[0], int(groups.max()) + 1, tensor.shape[2])
            sums.index_add_(1, groups, part)
            counts = torch.bincount(groups).clamp(min=1).to(sums.dtype)
            tensor[:, dropped] = (sums / counts[None, :, None])[:, groups]


stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
correct = {rule: 0 for rule in rules}
prompts = build_items(tokenizer, tasks, [length], items)
for item in prompts:
    ids = tokenizer(item.text, return_tensors="pt")["input_ids"]
    state["scores"].clear()
    state["masks"] = None
    with torch.no_grad():
        prefill = model(ids, use_cache=True)
    heads = torch.stack(state["scores"])  # (layers, heads, n)
    segments = segment_ids(end_table[ids[0]])
    text_of = {}
    for position, segment in enumerate(segments.tolist()):
        text_of[segment] = text_of.get(segment, "") + tokenizer.decode(ids[0, position : position + 1])
    needle_segments = [s for s, t in text_of.items() if "magic" in t and any(v in t for v in item.expected)]
    state["needles"] = torch.isin(segments, torch.tensor(needle_segments)).nonzero().flatten()
    line = []
    for rule in rules:
        cache = copy.deepcopy(prefill.past_key_values)
        merge = rule.split("_")[1] if rule in ("sum_zerov", "sum_mean", "sum_segmean") else None
        masks = kept(heads, segments, "sum" if merge else rule)
        if merge:
            merge_dropped(cache, masks, segments, merge)
            masks = torch.ones_like(masks)
        state["masks"], state["prompt"] = masks, ids.shape[1]
        token = int(prefill.logits[0, -1].argmax())
        answer = [token]
        with torch.no_grad():
            for _ in range(ANSWER_TOKENS[item.task] - 1):
                step = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
                cache, token = step.past_key_values, int(step.logits[0, -1].argmax())
                if token in stops:
                    break
                answer.append(token)
        text = tokenizer.decode(answer)
        ok = is_correct(item, text)
        correct[rule] += ok
        line.append(f"{rule}:{int(ok)}")
        if verbose:
            print(f"    {rule} {text!r} expected {item.expected}")
    print(item.task, item.index, ids.shape[1], " ".join(line), flush=True)
print("correct of", len(prompts), correct)
