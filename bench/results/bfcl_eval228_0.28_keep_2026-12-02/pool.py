import json, sys
from collections import defaultdict
first = {"full": "bench/results/pask_schema_example_2026-12-01/eval128_base028.json",
         "pask": "bench/results/pask_schema_example_2026-12-01/eval128_pask_ex028.json"}
def configs(path):
    return {c["policy"]: c for c in json.load(open(path))["configs"]}
a = configs(first["full"]); a.update(configs(first["pask"]))
b = configs("bench/results/bfcl_eval228_0.28_keep_2026-12-02/next_base.json"); b.update(configs("bench/results/bfcl_eval228_0.28_keep_2026-12-02/next_pask.json"))
cats = ["simple_python","multiple","parallel","parallel_multiple","live_simple","live_multiple","live_parallel","live_parallel_multiple"]
rows = {}
for pol in ["full", "pask", "streaming-llm", "snapkv"]:
    per = {}
    for c in cats:
        n = k = 0
        for src in (a, b):
            cc = src[pol]["categories"].get(c)
            if cc: n += cc["n"]; k += cc["correct"]
        per[c] = (k, n)
    avg = sum(k / n for k, n in per.values()) / len(cats) * 100
    tot = sum(k for k, n in per.values()), sum(n for k, n in per.values())
    rows[pol] = (per, avg, tot)
print("| category | " + " | ".join(rows) + " |")
print("|---|" + "---:|" * len(rows))
for c in cats:
    print(f"| {c} | " + " | ".join(f"{100*rows[p][0][c][0]/rows[p][0][c][1]:.1f} ({rows[p][0][c][0]}/{rows[p][0][c][1]})" for p in rows) + " |")
print("| **correct** | " + " | ".join(f"{rows[p][2][0]}/{rows[p][2][1]}" for p in rows) + " |")
print("| **average (category mean)** | " + " | ".join(f"**{rows[p][1]:.1f}**" for p in rows) + " |")
