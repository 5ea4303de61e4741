"""One-off: the restore table of restore.py's JSON (mean over items of the recovered share of the
log-likelihood gap, the role's dropped tokens against as many random dropped tokens).
usage: python summarize.py lost11.json"""
import json
import statistics
import sys

records = json.load(open(sys.argv[1]))
roles = sorted({role for r in records for role in r["roles"]})
print(f"{len(records)} items; LL of the full-KV answer: PASK {statistics.mean(r['ll_pask'] for r in records):.2f}, "
      f"full KV {statistics.mean(r['ll_full'] for r in records):.2f} (means)")
print("| role given back in every group | items | restored share of the prompt (mean per group) | gap recovered: the role | gap recovered: as many random dropped tokens | items where the role recovers more |")
print("|---|---:|---:|---:|---:|---:|")
for role in roles:
    rows = [(r, r["roles"][role]) for r in records if role in r["roles"]]
    gap = [(x["ll"] - r["ll_pask"]) / (r["ll_full"] - r["ll_pask"]) for r, x in rows]
    rnd = [(x["ll_random"] - r["ll_pask"]) / (r["ll_full"] - r["ll_pask"]) for r, x in rows]
    share = statistics.mean(x["restored_share"] for _, x in rows)
    more = sum(a > b for a, b in zip(gap, rnd))
    print(f"| {role} | {len(rows)} | {share:.3f} | {statistics.mean(gap):+.2f} | {statistics.mean(rnd):+.2f} | {more} of {len(rows)} |")
