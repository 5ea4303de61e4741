import sys, torch
from sglang_pask.structkv import CentralityAccumulator, select_skeleton, select_kv
from sglang_pask.policy.pooling import max_pool_by_position
data = torch.load(sys.argv[1])
def skel(scores, w, decay, first, pivot, k, ratio=0.2):
    acc = CentralityAccumulator(decay, first)
    for l in range(pivot + 1):
        acc.add(scores[l, scores.shape[1] - w:, :].sum(0))
    c = acc.centrality(pivot); n = c.numel()
    c = max_pool_by_position(torch.arange(n), c, k)
    return set(select_skeleton(c, ratio, w).tolist())
variants = {}
for w in (8, 32):
    for k in (1, 7, 15):
        variants[f"structkv w{w} k{k}"] = dict(w=w, decay=0.9, first=8, pivot=11, k=k)
        variants[f"fixed    w{w} k{k}"] = dict(w=w, decay=0.0, first=11, pivot=11, k=k)
    variants[f"struct0  w{w} k7"] = dict(w=w, decay=0.9, first=0, pivot=11, k=7)
    variants[f"structkv p14 w{w} k7"] = dict(w=w, decay=0.9, first=8, pivot=14, k=7)
    variants[f"fixed p14 w{w} k7"] = dict(w=w, decay=0.0, first=14, pivot=14, k=7)
for name, v in variants.items():
    full = tot = cov = 0
    per = []
    for it in data:
        keys = set(it["keys"]); s = skel(it["scores"], **v)
        c = len(keys & s); cov += c; tot += len(keys); full += c == len(keys); per.append(f"{c}/{len(keys)}")
    print(f"{name:24s} items fully covered {full}/{len(data)}  tokens {cov}/{tot}  ", " ".join(per))
