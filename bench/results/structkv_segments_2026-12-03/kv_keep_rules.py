"""One-off: on recorded scores (record_scores.py), the StructKV skeleton by segments at the auto pivot
(centrality of layers 8-11, R_struct 0.2, window 32), then for every layer the KV it would keep at
R_KV 0.1 (window 8) among its candidates (all tokens up to layer 11, the skeleton after) by
several rules; prints, per prompt, how many of the 24 layers keep every answer token.

    PYTHONPATH=. .venv/bin/python bench/results/structkv_segments_2026-12-03/kv_keep_rules.py OUT.pt
"""
import sys

import torch
from sglang_pask.structkv import segment_skeleton, segment_kv_keep, kv_keep
from sglang_pask.structkv.segments import _segment_top
from sglang_pask.structkv.skeleton import top_count
rows = torch.load(sys.argv[1])
def seg_kv(scores, cand, segs, ratio, window, how):
    n = scores.numel()
    count = min(cand.numel(), top_count(ratio, n) + min(window, n))
    s = scores[cand]; sg = segs[cand]
    if how == "max":
        m = torch.zeros(int(sg.max()) + 1).scatter_reduce(0, sg, s, reduce="amax", include_self=False)
        # rank by segment max: emulate by giving each token its segment's max as score then order
        key = m[sg]
        inwin = cand >= n - window
        rank = key.masked_fill(inwin, float("inf"))
        order = torch.sort(s, descending=True, stable=True).indices
        order = order[torch.sort(rank[order], descending=True, stable=True).indices]
        return cand[order[:count].sort().values]
    return segment_kv_keep(scores, cand, segs, ratio, window)
for how in ("mean", "max", "tokens"):
    allheld = 0; per = []
    for r in rows:
        S, segs, keys = r["scores"], r["segments"], set(r["keys"])
        n = S.shape[1]
        C = sum(0.9 ** (11 - l) * S[l] for l in range(8, 12))
        skel = segment_skeleton(C, segs, 0.2, 32)
        ok_layers = 0
        for l in range(24):
            cand = torch.arange(n) if l <= 11 else skel
            keep = kv_keep(S[l], cand, 0.1, 8) if how == "tokens" else seg_kv(S[l], cand, segs, 0.1, 8, how)
            ok_layers += keys <= set(keep.tolist())
        per.append(ok_layers)
        allheld += keys <= set(skel.tolist())
    print(how, "skeleton holds all:", allheld, "/", len(rows), " layers whose KV holds all answer tokens per prompt:", per)
print("--- by centrality / mixes")
for name in ("centrality", "layer+centrality"):
    per = []
    for r in rows:
        S, segs, keys = r["scores"], r["segments"], set(r["keys"])
        n = S.shape[1]
        C = sum(0.9 ** (11 - l) * S[l] for l in range(8, 12))
        skel = segment_skeleton(C, segs, 0.2, 32)
        ok = 0
        for l in range(24):
            cand = torch.arange(n) if l <= 11 else skel
            sc = C if name == "centrality" else S[l] / S[l].sum() + C / C.sum()
            keep = segment_kv_keep(sc, cand, segs, 0.1, 8)
            ok += keys <= set(keep.tolist())
        per.append(ok)
    print(name, per)
