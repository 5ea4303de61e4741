"""Side by side on the 228 evaluation items: this folder's runs (keys at 4 bits, values at 2,
0.047 of the prompt in full) against full KV, the best dropping baseline and the 2-bit runs at the
same bytes (0.12 in full).

``python -m bench.bfcl --from-json`` pools runs by policy@budget; this script relabels each run by
its storage and prints ``bench.bfcl``'s own tables (paired bootstrap of the category mean, McNemar
counts). Runs not there yet are left out.

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/pask_k4v2_eval228_2026-12-06/compare.py
"""
import json
from pathlib import Path

from bench.bfcl import format_item_by_item
from sglang_pask.bfcl.report import ConfigResult, configs_from_record, format_differences, format_table

RESULTS = Path("bench/results")
HERE = RESULTS / "pask_k4v2_eval228_2026-12-06"
STANDING = [RESULTS / "bfcl_eval126_float32_2026-12-03/eval126_base.json",
            RESULTS / "bfcl_1.5B_eval228_2026-12-05/next102_0.5B.json"]
# (files, policy, budget, label) of each run, in table order.
RUNS = [
    (STANDING, "full", 1.0, "full"),
    ([HERE / "eval228_k4v2.json"], "pask", 0.047, "pask-k4v2"),
    ([HERE / "eval228_k4v2.json"], "streaming-llm", 0.047, "streaming-llm-k4v2"),
    ([RESULTS / "pask_2bit_dropped_eval228_2026-12-05/eval228_2bit_012.json"], "pask", 0.12, "pask-2bit"),
    ([RESULTS / "pask_2bit_radix_eval228_2026-12-06/eval228_2bit_012_streaming.json"], "streaming-llm", 0.12,
     "streaming-llm-2bit"),
    (STANDING, "streaming-llm", 0.28, "streaming-llm-drop"),
]


def load(paths: list[Path], policy: str, budget: float, label: str):
    items, found = [], None
    for path in (p for p in paths if p.exists()):
        for config in configs_from_record(json.loads(path.read_text())):
            if (config.policy, config.budget) == (policy, budget) and config.items:
                items += config.items
                found = config
    return None if found is None else ConfigResult(label, budget, items, found.wall_s, found.server)


configs = [c for c in (load(*run) for run in RUNS) if c is not None]
references = [configs[0]] + [c for c in configs if c.policy in ("streaming-llm-k4v2", "pask-2bit", "streaming-llm-drop")]
print(format_table(configs), "", format_differences(configs, references), "",
      format_item_by_item(configs, references), sep="\n")
