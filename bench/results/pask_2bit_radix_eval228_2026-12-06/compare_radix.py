"""Side by side: PASK 0.12 + 2-bit with the radix cache on (this folder) against full KV and against
the same configuration with the cache off (``../pask_2bit_dropped_eval228_2026-12-05``).

``python -m bench.bfcl --from-json`` pools runs by policy@budget, so it cannot hold two runs of
pask@0.12; this script relabels the radix-on run ``pask-radix@0.12`` (nothing else changes) and
prints the same tables (``bench.bfcl``'s own functions).

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/pask_2bit_radix_eval228_2026-12-06/compare_radix.py
"""
import json
from pathlib import Path

from bench.bfcl import format_item_by_item
from sglang_pask.bfcl.report import ConfigResult, configs_from_record, format_differences, format_table

RESULTS = Path("bench/results")
FULL = [RESULTS / "bfcl_eval126_float32_2026-12-03/eval126_base.json",
        RESULTS / "bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json"]
RADIX_OFF = RESULTS / "pask_2bit_dropped_eval228_2026-12-05/eval228_2bit_012.json"
RADIX_ON = RESULTS / "pask_2bit_radix_eval228_2026-12-06/eval228_2bit_012_radix.json"


def load(path: Path, policy: str, budget: float) -> ConfigResult:
    return next(c for c in configs_from_record(json.loads(path.read_text())) if (c.policy, c.budget) == (policy, budget))


full = ConfigResult("full", 1.0, [item for path in FULL for item in load(path, "full", 1.0).items])
radix_off = load(RADIX_OFF, "pask", 0.12)
on = load(RADIX_ON, "pask", 0.12)
radix_on = ConfigResult("pask-radix", 0.12, on.items, on.wall_s, on.server)
configs = [full, radix_off, radix_on]
print(format_table(configs), "", format_differences(configs, [full, radix_off]), "",
      format_item_by_item(configs, [full, radix_off]), sep="\n")
