"""Pool two BFCL runs over disjoint items into one table: python pool.py FIRST_BASE FIRST_PASK NEXT_BASE NEXT_PASK

Each argument is a ``bench.bfcl --json`` file; the base files hold full, streaming-llm and snapkv,
the PASK files pask. Per category, correct answers and items are summed over the two runs.
"""
import json
import sys

CATS = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
        "live_parallel", "live_parallel_multiple"]


def configs(path):
    return {c["policy"]: c for c in json.load(open(path))["configs"]}


first_base, first_pask, next_base, next_pask = sys.argv[1:5]
runs = [{**configs(first_base), **configs(first_pask)}, {**configs(next_base), **configs(next_pask)}]
rows = {}
for policy in ["full", "pask", "streaming-llm", "snapkv"]:
    per = {}
    for cat in CATS:
        scores = [run[policy]["categories"][cat] for run in runs if cat in run[policy]["categories"]]
        per[cat] = (sum(s["correct"] for s in scores), sum(s["n"] for s in scores))
    average = sum(k / n for k, n in per.values()) / len(CATS) * 100
    rows[policy] = (per, average, sum(k for k, _ in per.values()), sum(n for _, n in per.values()))
print("| category | " + " | ".join(rows) + " |")
print("|---|" + "---:|" * len(rows))
for cat in CATS:
    print(f"| {cat} | " + " | ".join(f"{100 * r[0][cat][0] / r[0][cat][1]:.1f} ({r[0][cat][0]}/{r[0][cat][1]})"
                                       for r in rows.values()) + " |")
print("| **correct** | " + " | ".join(f"{r[2]}/{r[3]}" for r in rows.values()) + " |")
print("| **average (category mean)** | " + " | ".join(f"**{r[1]:.1f}**" for r in rows.values()) + " |")
