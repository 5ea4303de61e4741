"""bench.long_context's prompt-by-prompt table over several runs' --json files.

python paired_by_length.py [FILE ...]  (from the repository root, PYTHONPATH=.)

Without files: issue 6's 60 prompts of 2026-12-04 (the four runs below).
"""
import json
import sys

from bench.long_context import Outcome, format_paired, paired_comparisons

RUNS = ["bench/results/structkv_segments_2026-12-03/noise_stat8.json", "bench/results/structkv_segments_2026-12-03/essay8k.json",
        "bench/results/long_context_noise8k_2026-12-04/noise8k_sf.json",
        "bench/results/long_context_essay_rerun_2026-12-04/essay2k4k_sf.json"]
outcomes = [Outcome(**r) for path in sys.argv[1:] or RUNS for r in json.load(open(path, encoding="utf-8"))["results"]]
print(format_paired(paired_comparisons(outcomes), markdown=True))
