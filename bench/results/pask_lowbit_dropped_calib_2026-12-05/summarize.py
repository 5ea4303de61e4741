"""One-off: the table of lowbit.py's JSON. usage: python summarize.py lost11.json"""
import json
import statistics
import sys

records = json.load(open(sys.argv[1]))
variants = [k for k in records[0] if k not in ("id", "prompt", "answer")]
print(f"{len(records)} items, {sum(r['answer'] for r in records)} answer tokens")
print("| cache the answer reads | correct answer's log-likelihood (mean) | gap to full KV recovered (mean over items) | steps whose most likely token is the answer's | items where every step's is (as with full KV) |")
print("|---|---:|---:|---:|---:|")
for v in variants:
    ll = statistics.mean(r[v][0] for r in records)
    rec = statistics.mean((r[v][0] - r["drop@0.28"][0]) / (r["full"][0] - r["drop@0.28"][0]) for r in records)
    agree = sum(r[v][1] for r in records)
    whole = sum(r[v][1] >= r["full"][1] for r in records)
    print(f"| {v} | {ll:.2f} | {rec:+.2f} | {agree} | {whole} of {len(records)} |")
