import sys, torch
from pathlib import Path
exec(Path(__file__).with_name('cov_analyze.py').read_text().split("variants = {}")[0])
from sglang_pask.structkv import layer_statistics, transition_scores, detect_pivot, PromptPruning, PivotConfig
from sglang_pask.structkv.pivot import step_dominance
for w in (8,):
    for p in range(11, 17):
        for first in (8, p - 1):
            tot = full = 0
            for it in data:
                keys = set(it["keys"]); s = skel(it["scores"], w=w, decay=0.9, first=first, pivot=p, k=7)
                tot += len(keys & s); full += len(keys & s) == len(keys)
            print(f"decayed w{w} from {first} to {p}: {full}/12 {tot}/210")
for it in data[:12:2]:
    S = [it["scores"][l, -8:, :].sum(0) for l in range(24)]
    stats = torch.stack([layer_statistics(s) for s in S])
    T = transition_scores(stats)
    print(it["task"], it["index"], "offline pivot", detect_pivot(stats, 24), "H", " ".join(f"{x:.2f}" for x in stats[:, 0].tolist()))
    print("   rho", " ".join(f"{x:.2f}" for x in stats[:, 1].tolist()))
    print("   T  ", " ".join(f"{x:+.2f}" for x in T.tolist()))
    print("   dom", " ".join(f"{step_dominance(stats, s):.1f}" for s in range(23)))
