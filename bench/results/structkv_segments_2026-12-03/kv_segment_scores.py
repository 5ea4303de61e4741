"""One-off: as kv_keep_rules.py, each layer's KV keep by segments ranked by three aggregates of the
layer's own scores (the mean, as shipped; the sum over the square root of the length; the mean of
the top 3); prints per prompt how many of the 24 layers keep every answer token, and the total.

    PYTHONPATH=. .venv/bin/python bench/results/structkv_segments_2026-12-03/kv_segment_scores.py OUT.pt
"""
import sys

import torch
from sglang_pask.structkv import segment_skeleton
from sglang_pask.structkv.skeleton import top_count
rows = torch.load(sys.argv[1])
def keep_by(seg_score_fn, scores, cand, segs, ratio, window):
    n = scores.numel(); count = min(cand.numel(), top_count(ratio, n) + min(window, n))
    s, sg = scores[cand].float(), segs[cand]
    m = int(sg.max()) + 1
    segscore = seg_score_fn(s, sg, m)
    rank = segscore[sg].masked_fill(cand >= n - window, float("inf"))
    order = torch.sort(s, descending=True, stable=True).indices
    order = order[torch.sort(rank[order], descending=True, stable=True).indices]
    return cand[order[:count]]
def mean(s, sg, m):
    return torch.zeros(m).index_add_(0, sg, s) / torch.bincount(sg, minlength=m).clamp(min=1)
def sqrtn(s, sg, m):
    return torch.zeros(m).index_add_(0, sg, s) / torch.bincount(sg, minlength=m).clamp(min=1).float().sqrt()
def top3(s, sg, m):
    out = torch.zeros(m)
    for g in sg.unique().tolist():
        v = s[sg == g]; out[g] = v.topk(min(3, v.numel())).values.mean()
    return out
for name, fn in (("mean", mean), ("sum/sqrt(len)", sqrtn), ("top3 mean", top3)):
    per, needles = [], []
    for r in rows:
        S, segs, keys = r["scores"], r["segments"], set(r["keys"])
        n = S.shape[1]
        C = sum(0.9 ** (11 - l) * S[l] for l in range(8, 12))
        skel = segment_skeleton(C, segs, 0.2, 32)
        ok = 0
        for l in range(24):
            cand = torch.arange(n) if l <= 11 else skel
            ok += keys <= set(keep_by(fn, S[l], cand, segs, 0.1, 8).tolist())
        per.append(ok)
    print(f"{name:>14}", per, sum(per))
