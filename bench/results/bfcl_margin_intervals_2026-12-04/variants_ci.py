"""Paired bootstrap intervals between PASK variants run on the same 76 calibration items (float32).

python variants_ci.py BASE VARIANT [VARIANT ...]  (from the repository root, PYTHONPATH=.)

Each argument is a one-configuration ``bench.bfcl --json`` file; every variant is compared with BASE
(95% intervals, 10000 resamples, seed 0). Each configuration is renamed after its file, since all
are ``pask@0.28``.
"""
import json
import sys
from pathlib import Path

from sglang_pask.bfcl.report import ConfigResult, configs_from_record, paired_differences

if len(sys.argv) < 3:
    sys.exit(__doc__)
loaded = []
for path in sys.argv[1:]:
    (config,) = configs_from_record(json.load(open(path, encoding="utf-8")))
    loaded.append(ConfigResult(Path(path).stem, config.budget, config.items))
base, variants = loaded[0], loaded[1:]
print(f"minus {base.policy} ({sum(r.valid for r in base.items)} of {len(base.items)} correct, average {base.average():.1f})")
for variant, difference in zip(variants, paired_differences(variants, base)):
    print(f"{variant.policy}: {sum(r.valid for r in variant.items)} correct, {difference.cell()}")
