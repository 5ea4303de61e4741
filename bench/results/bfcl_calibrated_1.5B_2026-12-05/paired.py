"""Item by item: PASK with the 1.5B's own calibrated policy against PASK with the default model's
policy transferred by depth, and each against full KV, on the 126 evaluation items (exact two-sided
McNemar test on the items only one of the two answers right); then the same on the default model:
its own policy against the 1.5B's transferred to it (the addendum's run). One-off script for this folder; run
from the repository root: ``python bench/results/bfcl_calibrated_1.5B_2026-12-05/paired.py``."""

import json
from math import comb
from pathlib import Path

HERE = Path(__file__).parent
SECOND = HERE.parent / "bfcl_second_model_2026-12-05"
DEFAULT_MODEL = HERE.parent / "bfcl_eval126_float32_2026-12-03"


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


full = verdicts([SECOND / "m15_full.json", SECOND / "r15_base.json"], "full")
transferred = verdicts([SECOND / "m15_pask.json", SECOND / "r15_pask.json"], "pask")
calibrated = verdicts([HERE / "m15_pask_cal.json", HERE / "r15_pask_cal.json"], "pask")
assert set(full) == set(transferred) == set(calibrated) and len(full) == 126, "runs cover different items"
small_full = verdicts([DEFAULT_MODEL / "eval126_base.json"], "full")
small_own = verdicts([DEFAULT_MODEL / "eval126_pask.json"], "pask")
small_from_large = verdicts([HERE / "eval126_0.5B_pask_from1.5B.json"], "pask")
assert set(small_full) == set(small_own) == set(small_from_large) == set(full), "runs cover different items"
pairs = [("1.5B", "calibrated", calibrated, "transferred", transferred),
         ("1.5B", "calibrated", calibrated, "full KV", full),
         ("1.5B", "transferred", transferred, "full KV", full),
         ("0.5B", "own policy", small_own, "1.5B's policy transferred", small_from_large),
         ("0.5B", "1.5B's policy transferred", small_from_large, "full KV", small_full)]
for model, name_a, a, name_b, b in pairs:
    wins = sum(a[i] and not b[i] for i in full)
    losses = sum(b[i] and not a[i] for i in full)
    print(f"{model}: {name_a} ({sum(a.values())} right) against {name_b} ({sum(b.values())} right): "
          f"{wins} to {losses}, exact McNemar p = {mcnemar(wins, losses):.3f}")
