"""Paired bootstrap of StructKV's and the fixed pivot's accuracy over issue 6's 60 prompts.

python structkv_vs_fixed_ci.py FILE [FILE ...]  (``bench.long_context --json`` files; later files
replace earlier ones' answers to the same (mode, task, length, prompt))

Each resample redraws every (task, length) row's prompts with replacement, the same draw for every
mode; it prints each mode's correct count and the difference StructKV minus fixed pivot and StructKV
minus full KV in prompts of 60, with 95% percentile intervals (10000 resamples, seed 0), and the
exact two-sided McNemar (sign) test on the prompts the two modes answer differently: with a handful of
such prompts, all one way, the bootstrap interval is too narrow and the exact test is the one to read.
"""
import json
import sys

import numpy as np

from bench.common import exact_mcnemar_p

answers = {}
for path in sys.argv[1:]:
    for r in json.load(open(path, encoding="utf-8"))["results"]:
        answers[(r["mode"], r["task"], r["length"], r["index"])] = bool(r["correct"])
modes = ["full", "structkv", "fixed-pivot"]
rows = sorted({(t, n) for m, t, n, _ in answers if m == "structkv"})
strata = []
for task, length in rows:
    prompts = sorted(i for m, t, n, i in answers if (m, t, n) == ("structkv", task, length))
    strata.append(np.array([[answers[(m, task, length, i)] for m in modes] for i in prompts], dtype=float))
    print(task, length, len(prompts), "prompts;", "correct", dict(zip(modes, strata[-1].sum(axis=0).astype(int).tolist())))
total = sum(s.shape[0] for s in strata)
rng = np.random.default_rng(0)
counts = np.zeros((10000, len(modes)))
for s in strata:
    n = s.shape[0]
    counts += rng.multinomial(n, np.full(n, 1.0 / n), size=10000) @ s
point = sum(s.sum(axis=0) for s in strata)
print(f"{total} prompts; correct", dict(zip(modes, point.astype(int).tolist())))
for other in ("fixed-pivot", "full"):
    j = modes.index(other)
    low, high = np.percentile(counts[:, 1] - counts[:, j], [2.5, 97.5])
    wins = int(sum(((s[:, 1] == 1) & (s[:, j] == 0)).sum() for s in strata))
    losses = int(sum(((s[:, 1] == 0) & (s[:, j] == 1)).sum() for s in strata))
    p = exact_mcnemar_p(wins, losses)
    print(f"structkv minus {other}: {point[1] - point[j]:+.0f} of {total} [{low:+.0f}, {high:+.0f}]; "
          f"structkv alone right on {wins}, {other} alone on {losses}: exact McNemar p = {p:.3f}")
