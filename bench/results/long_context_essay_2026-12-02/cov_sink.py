import sys, torch
from pathlib import Path
exec(Path(__file__).with_name('cov_analyze.py').read_text().split("variants = {}")[0])
from sglang_pask.structkv import layer_statistics, transition_scores, detect_pivot, PromptPruning, PivotConfig
from sglang_pask.structkv.pivot import step_dominance
for it in data[:12:3]:
    S = [it["scores"][l, -8:, :].sum(0) for l in range(24)]
    tot = torch.stack([s.sum() for s in S])
    print(it["task"], it["index"], "sink share", " ".join(f"{(s[0]/s.sum()).item():.2f}" for s in S))
    print("   window share", " ".join(f"{(s[-8:].sum()/s.sum()).item():.2f}" for s in S))
    keys = it["keys"]
    print("   needle share", " ".join(f"{(s[keys].sum()/s[1:-8].sum()).item():.3f}" for s in S))
    C = [s[1:-8] for s in S]
    stats = torch.stack([layer_statistics(c / c.sum()) for c in C])
    T = transition_scores(stats)
    print("   content H", " ".join(f"{x:.2f}" for x in stats[:, 0].tolist()), "offline", detect_pivot(stats, 24))
    print("   rho", " ".join(f"{x:.2f}" for x in stats[:, 1].tolist()))
    print("   T  ", " ".join(f"{x:+.2f}" for x in T.tolist()))
