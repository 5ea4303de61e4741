"""One-off (2026-12-05): on the first N 2K niah-mv prompts, for every layer, how many of the four needle
sentences StructKV's per-layer R_KV 0.1 keep by segments holds, each needle segment's rank among the
prompt's segments by mean window score (last 32 queries, summed over heads), and the six top-ranked
segments (text start, token count).

    PYTHONPATH=. .venv/bin/python bench/results/structkv_kv_share_2k_2026-12-04/needle_ranks.py 2
"""
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from bench.long_context import build_items
from sglang_pask.default_model import ensure_default_model
from sglang_pask.structkv import segment_end_table, segment_ids, segment_kv_keep
from sglang_pask.structure import TokenVocab

W = 32  # window queries, as sim_decode.py
model_path = str(ensure_default_model())
tok = AutoTokenizer.from_pretrained(model_path)
vocab = TokenVocab.from_huggingface(tok)
end_table = segment_end_table(vocab.token_bytes, vocab.special_ids)
sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
scores = []
def attention(module, query, key, value, attention_mask, **kw):
    q = query[0, :, -W:, :].float(); k = key[0].float().repeat_interleave(q.shape[0] // key.shape[1], 0)
    n, w = k.shape[1], q.shape[1]
    fut = torch.arange(n)[None, :] > torch.arange(n - w, n)[:, None]
    s = kw.get("scaling") or q.shape[-1] ** -0.5
    scores.append(torch.softmax(((q @ k.transpose(-1, -2)) * s).masked_fill(fut, float("-inf")), -1).sum(1))
    return sdpa(module, query, key, value, attention_mask, **kw)
ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
items = build_items(tok, ["niah-mv"], [2048], int(sys.argv[1]))
for item in items[: int(sys.argv[1])]:
    ids = tok(item.text, return_tensors="pt")["input_ids"]
    scores.clear()
    with torch.no_grad(): model(ids)
    heads = torch.stack(scores)  # (L, H, n)
    seg = segment_ids(end_table[ids[0]])
    n = ids.shape[1]
    pieces = [tok.decode(ids[0, i:i+1]) for i in range(n)]
    # needle segment ids: segments whose text contains an expected value
    segtext = {}
    for i, s in enumerate(seg.tolist()): segtext[s] = segtext.get(s, "") + pieces[i]
    needle_segs = [s for s, t in segtext.items() if any(v in t for v in item.expected) and "magic" in t and s < seg.max() - 3]
    print(f"\n== item {item.index} n={n} expected={item.expected} needle segs={needle_segs}")
    for layer in range(heads.shape[0]):
        summed = heads[layer].sum(0)
        keep = segment_kv_keep(summed, torch.arange(n), seg, 0.1, 8)
        kept_segs = set(seg[keep].tolist())
        held = [s for s in needle_segs if all(i in set(keep.tolist()) for i in (seg == s).nonzero().flatten().tolist())]
        # segment means rank
        sizes = torch.bincount(seg).clamp(min=1).float()
        mean = torch.zeros(int(seg.max()) + 1).index_add_(0, seg, summed) / sizes
        order = torch.argsort(mean, descending=True).tolist()
        ranks = [order.index(s) for s in needle_segs]
        print(f"L{layer:2d} needles held {len(held)}/{len(needle_segs)} ranks {ranks} kept segs {len(kept_segs)} "
              f"top: " + " | ".join(f"{segtext[s][:25]!r}({int((seg==s).sum())})" for s in order[:6]))
