import sys, torch
from sglang_pask.structkv import PromptPruning, PivotConfig
data = torch.load(sys.argv[1])
for mp in (8, 12, 13, 14):
    res = []
    for it in data:
        S = [it["scores"][l, -8:, :].sum(0) for l in range(24)]
        pr = PromptPruning(PivotConfig(), 24, S[0].numel(), 0.2, 8, min_pivot_fraction=mp / 24)
        for l, s in enumerate(S):
            d = pr.observe(l, s)
            if d is not None:
                keys = set(it["keys"]); sk = set(d.skeleton.tolist())
                res.append(f"{d.pivot}/{d.decided_at}:{len(keys & sk)}/{len(keys)}")
                break
    print("min pivot", mp, " ".join(res))
