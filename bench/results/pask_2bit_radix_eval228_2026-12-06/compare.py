"""Side by side: this folder's runs against full KV and against PASK 0.12 + 2-bit with the radix
cache off (``../pask_2bit_dropped_eval228_2026-12-05``), on the 228 evaluation items.

``python -m bench.bfcl --from-json`` pools runs by policy@budget, so it cannot hold several runs of
pask@0.12; this script relabels this folder's PASK runs (``pask-radix@0.12``: radix cache on;
``pask-rotated@0.12``: values rotated, reverted since) and prints ``bench.bfcl``'s own tables
(paired bootstrap of the category mean, McNemar counts). Runs not there yet are left out.

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/pask_2bit_radix_eval228_2026-12-06/compare.py
"""
import json
from pathlib import Path

from bench.bfcl import format_item_by_item
from sglang_pask.bfcl.report import ConfigResult, configs_from_record, format_differences, format_table

RESULTS = Path("bench/results")
HERE = RESULTS / "pask_2bit_radix_eval228_2026-12-06"
FULL = [RESULTS / "bfcl_eval126_float32_2026-12-03/eval126_base.json",
        RESULTS / "bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json"]
STANDING = RESULTS / "pask_2bit_dropped_eval228_2026-12-05"
# (file, policy, budget, label) of each run, in table order.
RUNS = [
    (STANDING / "eval228_2bit_012.json", "pask", 0.12, "pask"),
    (STANDING / "eval228_2bit_012_snapkv.json", "snapkv", 0.12, "snapkv"),
    (HERE / "eval228_2bit_012_streaming.json", "streaming-llm", 0.12, "streaming-llm"),
    (HERE / "eval228_2bit_012_radix.json", "pask", 0.12, "pask-radix"),
    (HERE / "eval228_2bit_012_rotated.json", "pask", 0.12, "pask-rotated"),
]


def load(path: Path, policy: str, budget: float, label: str) -> ConfigResult:
    config = next(c for c in configs_from_record(json.loads(path.read_text())) if (c.policy, c.budget) == (policy, budget))
    return ConfigResult(label, budget, config.items, config.wall_s, config.server)


full = ConfigResult("full", 1.0, [item for path in FULL for item in load(path, "full", 1.0, "full").items])
configs = [full] + [load(*run) for run in RUNS if run[0].exists()]
references = [full, configs[1]]
print(format_table(configs), "", format_differences(configs, references), "",
      format_item_by_item(configs, references), sep="\n")
