"""Item by item on the 1.5B with its own calibrated PASK policy: PASK against full KV and against each
baseline (exact two-sided McNemar test on the items only one of the two answers right), on the 102
new evaluation items and on all 228; then the same on the default model in float32 (the addendum's
run). One-off script for this folder; run from the repository root:
``python bench/results/bfcl_1.5B_eval228_2026-12-05/paired.py``."""

import json
from math import comb
from pathlib import Path

HERE = Path(__file__).parent
EARLIER = [HERE.parent / "bfcl_second_model_2026-12-05" / name for name in ("m15_full.json", "m15_base.json",
                                                                            "r15_base.json")]
EARLIER += [HERE.parent / "bfcl_calibrated_1.5B_2026-12-05" / name for name in ("m15_pask_cal.json",
                                                                                "r15_pask_cal.json")]
NEW = [HERE / "next102_base.json", HERE / "next102_pask.json"]
DEFAULT_MODEL_126 = [HERE.parent / "bfcl_eval126_float32_2026-12-03" / name for name in ("eval126_base.json",
                                                                                         "eval126_pask.json")]
DEFAULT_MODEL_NEW = [HERE / "next102_0.5B.json"]
POLICIES = ("full", "pask", "streaming-llm", "snapkv")


def verdicts(paths: list[Path], policy: str) -> dict[str, bool]:
    """Item id -> AST verdict of ``policy``'s answers in the runs ``paths``."""
    out: dict[str, bool] = {}
    for path in paths:
        for config in json.loads(path.read_text())["configs"]:
            if config["policy"] == policy:
                out.update({item["id"]: item["valid"] for item in config["items"]})
    return out


def mcnemar(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p-value of ``wins`` against ``losses`` discordant items."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


for label, paths, size in (("1.5B, 102 new items", NEW, 102), ("1.5B, all 228 items", EARLIER + NEW, 228),
                           ("default model, 102 new items", DEFAULT_MODEL_NEW, 102),
                           ("default model, all 228 items", DEFAULT_MODEL_126 + DEFAULT_MODEL_NEW, 228)):
    answers = {policy: verdicts(paths, policy) for policy in POLICIES}
    items = set(answers["full"])
    assert len(items) == size and all(set(a) == items for a in answers.values()), "runs cover different items"
    print(label + ": " + ", ".join(f"{p} {sum(a.values())}" for p, a in answers.items()))
    for other in ("full", "streaming-llm", "snapkv"):
        wins = sum(answers["pask"][i] and not answers[other][i] for i in items)
        losses = sum(answers[other][i] and not answers["pask"][i] for i in items)
        print(f"  pask against {other}: {wins} to {losses}, exact McNemar p = {mcnemar(wins, losses):.3g}")
