import re
from sglang_pask.bfcl.data import AST_CATEGORIES, load_items
from sglang_pask.bfcl.split import split_items
STOP = set("the a an of to in for on and or is are be by with from as at this that it its into your you can will given specified specific which what how get set use using find calculate provide provides retrieve return returns based".split())
def words(s):
    s = re.sub(r"([a-z])([A-Z])", r"\1 \2", s)
    return {w for w in re.findall(r"[a-z0-9]+", s.lower()) if len(w) >= 3 and w not in STOP}
def stem(ws): return {w[:5] for w in ws}
for split in ("calib", "eval"):
    items = split_items(load_items(AST_CATEGORIES), split)
    multi = [it for it in items if len(it.functions) > 1]
    gated = bad = total = items_gated = 0
    for it in multi:
        q = stem(words(" ".join(m["content"] for m in it.messages if m["role"] == "user")))
        gt = {g for c in it.ground_truth for g in c}
        rel = [bool(stem(words(f["name"] + " " + f.get("description", ""))) & q) for f in it.functions]
        if not any(rel): continue
        total += len(it.functions)
        for f, r in zip(it.functions, rel):
            if not r:
                gated += 1; bad += f["name"] in gt
        items_gated += not all(rel)
    print(split, "multi-function items", len(multi), "items with a gated function", items_gated, "functions", total, "gated", gated, "of them called", bad)
