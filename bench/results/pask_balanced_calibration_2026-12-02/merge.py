"""Pool the sensitivity measurements of two calibrations, weighted by their sensitivity items.

python merge.py SHIPPED.json BALANCED.json OUT.json, then refit OUT.json with
``python -m sglang_pask.calibrate --refit OUT.json --budget 0.28 --kv-decode keep``.
Each error rate becomes (rate_a * n_a + rate_b * n_b) / (n_a + n_b); a role one file did not probe
counts as 0 there (its screening found it harmless or too rare). Everything else is BALANCED's.
"""
import json
import sys

shipped, balanced, out = sys.argv[1:4]
a, b = json.load(open(shipped)), json.load(open(balanced))
ca, cb = a["calibration"], b["calibration"]
na, nb = len(ca["sensitivity_items"]), len(cb["sensitivity_items"])


def pooled(da, db):
    return {k: (da.get(k, 0) * na + db.get(k, 0) * nb) / (na + nb) for k in set(da) | set(db)}


cm = b["calibration"]
cm["error_rate_dropped_everywhere"] = pooled(ca["error_rate_dropped_everywhere"], cb["error_rate_dropped_everywhere"])
cm["error_rate_dropped"] = pooled(ca["error_rate_dropped"], cb["error_rate_dropped"])
cm["sensitivity_items"] = ca["sensitivity_items"] + [i for i in cb["sensitivity_items"] if i not in ca["sensitivity_items"]]
cm["items"] = sorted(set(ca["items"]) | set(cb["items"]))
cm["merged_from"] = [shipped, balanced]
json.dump(b, open(out, "w"), indent=1)
