"""One-off: prompt-by-prompt comparisons across this folder's runs (each fixed pivot ran in its own run,
and bench.long_context pools answers by mode name, so the two fixed pivots cannot share one table).

Run from the repository root: PYTHONPATH=. python bench/results/structkv_second_model_2026-12-05/paired.py
"""
import json
from pathlib import Path

from bench.common import exact_mcnemar_p

HERE = Path(__file__).resolve().parent


def answers(name: str, mode: str) -> dict:
    runs = json.loads((HERE / name).read_text())["results"]
    return {(r["task"], r["length"], r["index"]): r["correct"] for r in runs if r["mode"] == mode}


SETS = {
    "items 0-2, 4K": {"full KV": answers("m15_4k.json", "full"), "StructKV (auto)": answers("m15_4k.json", "structkv"),
                      "fixed pivot 11": answers("m15_4k.json", "fixed-pivot"),
                      "fixed pivot 13": answers("m15_4k_fp13.json", "fixed-pivot"),
                      "fixed pivot 14": answers("m15_4k_fp14.json", "fixed-pivot"),
                      "StructKV, pivot 14": answers("m15_4k_sk14.json", "structkv")},
    "items 3-5, 2K+4K (pre-registered)": {"full KV": answers("fresh_A.json", "full"),
                                          "StructKV (auto)": answers("fresh_A.json", "structkv"),
                                          "fixed pivot 11": answers("fresh_A.json", "fixed-pivot"),
                                          "fixed pivot 14": answers("fresh_B.json", "fixed-pivot")},
    "items 0-2, 8K": {"full KV": answers("m15_8k.json", "full"), "StructKV (auto)": answers("m15_8k.json", "structkv"),
                      "fixed pivot 14": answers("m15_8k.json", "fixed-pivot"),
                      "fixed pivot 11": answers("m15_8k_fp11.json", "fixed-pivot")},
}
for title, modes in SETS.items():
    auto = modes["StructKV (auto)"]
    print(f"{title}: {len(auto)} prompts")
    for mode, got in modes.items():
        assert got.keys() == auto.keys(), mode
        only_auto = sum(auto[k] and not got[k] for k in auto)
        only_mode = sum(got[k] and not auto[k] for k in auto)
        print(f"  {mode:20s} correct {sum(got.values()):2d}   StructKV (auto) alone right {only_auto}, "
              f"{mode} alone right {only_mode}, exact McNemar p = {exact_mcnemar_p(only_auto, only_mode):.3f}")
