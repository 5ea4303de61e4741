import sys, torch
from pathlib import Path
exec(Path(__file__).with_name('cov_analyze.py').read_text().split("variants = {}")[0])
for w in (8, 32):
    for k in (7,):
        row = []
        for p in range(6, 20):
            tot = 0; full = 0
            for it in data:
                keys = set(it["keys"]); s = skel(it["scores"], w=w, decay=0.0, first=p, pivot=p, k=k)
                tot += len(keys & s); full += len(keys & s) == len(keys)
            row.append(f"L{p}:{full}/{tot}")
        print(f"single layer w{w} k{k}:", " ".join(row))
        row = []
        for first in (9, 10, 11):
            tot = full = 0
            for it in data:
                keys = set(it["keys"]); s = skel(it["scores"], w=w, decay=0.9, first=first, pivot=11, k=k)
                tot += len(keys & s); full += len(keys & s) == len(keys)
            row.append(f"from{first}:{full}/{tot}")
        print(f"decayed to 11 w{w} k{k}:", " ".join(row))
