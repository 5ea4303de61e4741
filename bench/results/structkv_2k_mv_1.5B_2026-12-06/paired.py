"""One-off: the 2K multi-value prompts of this folder's 1.5B runs beside the default model's
answers to the same prompts (same tokenizer, same seed), prompt by prompt.

    PYTHONPATH=. python bench/results/structkv_2k_mv_1.5B_2026-12-06/paired.py
"""
import json
from pathlib import Path

from bench.common import exact_mcnemar_p

HERE = Path(__file__).parent
DEFAULT_MODEL = HERE.parent / "structkv_central_kv_2026-12-06" / "pooled.json"


def correct(path: Path, length: int = 2048, task: str = "niah-mv") -> dict[tuple[str, int], bool]:
    """(mode, item index) -> correct, for one length and task of a bench.long_context JSON."""
    return {(r["mode"], r["index"]): r["correct"] for r in json.loads(path.read_text())["results"]
            if r["length"] == length and r["task"] == task}


large = {**correct(HERE / "mv_i10.json"), **correct(HERE / "mv_i35.json")}
small = correct(DEFAULT_MODEL)
items = sorted(index for mode, index in large if mode == "full")
print("item  1.5B full  1.5B StructKV  0.5B full  0.5B StructKV")
for index in items:
    row = [large[("full", index)], large[("structkv", index)], small.get(("full", index)), small.get(("structkv", index))]
    print(f"{index:4d}  " + "  ".join(f"{'-' if v is None else int(v):>9}" for v in row))
for name, answers in (("1.5B", large), ("0.5B", small)):
    full = sum(answers[("full", i)] for i in items)
    structkv = sum(answers[("structkv", i)] for i in items)
    only_s = sum(answers[("structkv", i)] and not answers[("full", i)] for i in items)
    only_f = sum(answers[("full", i)] and not answers[("structkv", i)] for i in items)
    print(f"{name}: full KV {full}, StructKV {structkv} ({structkv / full:.2f} of full); "
          f"only StructKV right {only_s}, only full right {only_f}, exact McNemar p {exact_mcnemar_p(only_s, only_f):.3f}")
