"""One-off: StructKV's answers to the 2K multi-value prompts at R_KV 0.2 and 0.3 (this folder)
beside full KV's (the R_KV 0.2 runs, interleaved) and StructKV's at the default R_KV 0.1 (earlier
runs on the same prompts, `structkv_central_kv_2026-12-06/pooled.json`), prompt by prompt.

    PYTHONPATH=. python bench/results/structkv_2k_kv_ratio_2026-12-06/paired.py
"""
import json
from pathlib import Path

from bench.common import exact_mcnemar_p

HERE = Path(__file__).parent
EARLIER = HERE.parent / "structkv_central_kv_2026-12-06" / "pooled.json"


def answers(paths: list[Path]) -> dict[tuple[str, int], bool]:
    """(mode, item index) -> correct over the 2K niah-mv prompts of bench.long_context JSONs."""
    return {(r["mode"], r["index"]): r["correct"] for path in paths for r in json.loads(path.read_text())["results"]
            if r["length"] == 2048 and r["task"] == "niah-mv"}


r02 = answers(sorted(HERE.glob("r02_i*.json")))
r03 = answers(sorted(HERE.glob("r03_i*.json")))
earlier = answers([EARLIER])
items = sorted(index for mode, index in r02 if mode == "full")
columns = {"full KV": [r02[("full", i)] for i in items],
           "R_KV 0.1 (earlier)": [earlier[("structkv", i)] for i in items],
           "R_KV 0.2": [r02[("structkv", i)] for i in items],
           "R_KV 0.3": [r03[("structkv", i)] for i in items]}
print("item  " + "  ".join(columns))
for row, index in enumerate(items):
    print(f"{index:4d}  " + "  ".join(f"{int(values[row]):>{len(name)}}" for name, values in columns.items()))
full = columns["full KV"]
for name, values in columns.items():
    only_mode = sum(v and not f for v, f in zip(values, full))
    only_full = sum(f and not v for v, f in zip(values, full))
    print(f"{name}: {sum(values)} of {len(items)}; against full KV {only_mode} : {only_full}, "
          f"exact McNemar p {exact_mcnemar_p(only_mode, only_full):.3f}")
