"""Paired bootstrap intervals of BFCL differences over pooled runs on disjoint items.

python margin_ci.py BASE PASK [BASE2 PASK2 ...]  (from the repository root, PYTHONPATH=.)

Each argument is a ``bench.bfcl --json`` file. The configurations of every BASE/PASK pair answered the
same items; the pairs answered disjoint items. Items are pooled per configuration label over the pairs,
configurations that ran on every pair's items are kept, then ``sglang_pask.bfcl.report.format_differences`` gives each configuration minus full KV and minus the
best baseline (the compressed configuration, PASK aside, with the highest average), 95% intervals from
10000 resamples, seed 0.
"""
import json
import sys

from sglang_pask.bfcl.report import ConfigResult, configs_from_record, format_differences, format_table

paths = sys.argv[1:]
if not paths or len(paths) % 2:
    sys.exit(__doc__)
pooled: dict[str, ConfigResult] = {}
for path in paths:
    for config in configs_from_record(json.load(open(path, encoding="utf-8"))):
        if config.label in pooled:
            pooled[config.label].items.extend(config.items)
        else:
            pooled[config.label] = ConfigResult(config.policy, config.budget, list(config.items))
# A configuration that ran on only some of the pairs (H2O, PyramidKV on the first 126 items) cannot be paired.
most = max(len(c.items) for c in pooled.values())
configs = [c for c in pooled.values() if len(c.items) == most]
print(f"{len(configs[0].items)} items per configuration")
print(format_table(configs))
full = next(c for c in configs if c.policy == "full")
best = max((c for c in configs if c.policy not in ("full", "pask")), key=ConfigResult.average)
print()
print(format_differences(configs, [full, best]))
