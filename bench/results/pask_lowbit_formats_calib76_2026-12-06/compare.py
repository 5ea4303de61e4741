"""Side by side: the screen's three PASK runs and full KV on the 76 calibration items.

``python -m bench.bfcl --from-json`` pools runs by policy@budget, so it cannot tell the two runs of
pask@0.047 apart; this script relabels each run by its block format and prints ``bench.bfcl``'s own
tables (paired bootstrap of the category mean, McNemar counts).

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/pask_lowbit_formats_calib76_2026-12-06/compare.py
"""
import json
from pathlib import Path

from bench.bfcl import format_item_by_item
from sglang_pask.bfcl.report import ConfigResult, configs_from_record, format_differences, format_table

RESULTS = Path("bench/results")
HERE = RESULTS / "pask_lowbit_formats_calib76_2026-12-06"
# (file, policy, budget, label) of each run, in table order.
RUNS = [
    (RESULTS / "pask_deferred_compression_calib76_2026-12-03/calib_f32_full.json", "full", 1.0, "full"),
    (HERE / "calib76_2bit.json", "pask", 0.12, "pask-2bit"),
    (HERE / "calib76_k2v4.json", "pask", 0.047, "pask-k2v4"),
    (HERE / "calib76_k4v2.json", "pask", 0.047, "pask-k4v2"),
]


def load(path: Path, policy: str, budget: float, label: str) -> ConfigResult:
    config = next(c for c in configs_from_record(json.loads(path.read_text())) if (c.policy, c.budget) == (policy, budget))
    return ConfigResult(label, budget, config.items, config.wall_s, config.server)


configs = [load(*run) for run in RUNS]
references = [configs[0], configs[1]]
print(format_table(configs), "", format_differences(configs, references), "",
      format_item_by_item(configs, references), sep="\n")
