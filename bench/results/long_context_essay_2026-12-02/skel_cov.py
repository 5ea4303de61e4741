"""One-off (session 19): how many of the asked needle's value tokens each skeleton variant holds.

Records every layer's window scores (last 32 queries, summed over heads) of the prompts in
transformers; usage: PYTHONPATH=. python skel_cov.py niah-mk,niah-mv 4096 6 OUT.pt
With a fifth argument ``heads``: per head instead, summed over the last 8 queries
(PYTHONPATH=. python skel_cov.py niah-mk,niah,vt 4096 3 OUT.pt heads)."""
import sys, json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from bench.long_context import build_items
from bench.pivot_profile import key_positions
from sglang_pask.default_model import ensure_default_model
from sglang_pask.structkv import CentralityAccumulator, select_skeleton
from sglang_pask.policy.pooling import max_pool_by_position

W = 32
PER_HEAD = sys.argv[5:6] == ["heads"]
class Rec:
    def __init__(self, att): self.att, self.scores = att, []
    def __call__(self, module, query, key, value, attention_mask, **kw):
        q = query[0, :, -W:, :].float(); k = key[0].float().repeat_interleave(q.shape[0] // key.shape[1], dim=0)
        n, w = k.shape[1], q.shape[1]
        logits = (q @ k.transpose(-1, -2)) * (kw.get("scaling") or q.shape[-1] ** -0.5)
        future = torch.arange(n)[None, :] > torch.arange(n - w, n)[:, None]
        probs = torch.softmax(logits.masked_fill(future, float("-inf")), -1)  # (heads, w, n)
        self.scores.append(probs[:, -8:].sum(1) if PER_HEAD else probs.sum(0))  # (heads, n) or (w, n)
        return self.att(module, query, key, value, attention_mask, **kw)

mp = str(ensure_default_model()); tok = AutoTokenizer.from_pretrained(mp)
rec = Rec(ALL_ATTENTION_FUNCTIONS["sdpa"]); ALL_ATTENTION_FUNCTIONS["sdpa"] = rec
model = AutoModelForCausalLM.from_pretrained(mp, dtype=torch.float32, attn_implementation="sdpa").eval()
tasks = sys.argv[1].split(","); lengths = [int(x) for x in sys.argv[2].split(",")]; items = int(sys.argv[3])
out = []
for item in build_items(tok, tasks, lengths, items):
    ids = tok(item.text, return_tensors="pt")["input_ids"]; rec.scores.clear()
    with torch.no_grad(): model(ids)
    keys = key_positions(tok, item.text, item.expected)
    per_layer = [s.clone() for s in rec.scores]  # each (W, n)
    out.append({"task": item.task, "length": item.length, "index": item.index, "keys": keys,
                "scores": torch.stack(per_layer)})
    print(item.task, item.length, item.index, len(keys), file=sys.stderr)
torch.save(out, sys.argv[4])
