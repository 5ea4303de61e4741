"""One-off (session 40): which of the prompt tokens PASK drops does a correct answer need?

For calibration items that full KV answers correctly, the correct answer (full KV's, from a stored
bench.bfcl run) is teacher-forced through the default model in transformers (float32, eager) with
each layer's answer queries masked to what PASK's server kept (bench.kept_set_reference, replay
exact to 6e-5 there), then with one prompt role's dropped tokens given back in every layer group,
and with as many dropped tokens of any role given back at random. Printed per item and role: the
answer's log-likelihood recovered, (LL_restored - LL_pask) / (LL_full - LL_pask), and the restored
share of the prompt.

usage (repository root; a PASK server started by the script):
  PYTHONPATH=. .venv/bin/python bench/results/pask_restore_attribution_calib76_2026-12-05/restore.py \
      BASE_JSON FULL_JSON POLICY_JSON OUT_JSON [lost|correct]
"""
import json
import random
import sys
import tempfile
from pathlib import Path

import requests
import torch
from transformers import AutoTokenizer

from bench.kept_set_reference import group_masks, load_reference, replay_logprobs, server_layer_groups
from sglang_pask.bfcl.data import load_items
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import ServerProcess

base_json, full_json, policy, out_json, which = sys.argv[1:6]
base = {i["id"]: i for i in json.load(open(base_json))["configs"][0]["items"]}
full = {i["id"]: i for i in json.load(open(full_json))["configs"][0]["items"]}
ids = [i for i in base if full[i]["valid"] and (which == "correct" or not base[i]["valid"])]
items = {item.id: item for item in load_items() if item.id in set(ids)}
model_path = str(ensure_default_model())
tok = AutoTokenizer.from_pretrained(model_path)
model = load_reference(model_path, torch.float32)
flags = ["--model-path", model_path, "--kv-policy", "pask", "--pask-policy", policy, "--kv-budget", "0.28",
         "--kv-layer-groups", "4", "--kv-decode", "keep", "--dtype", "float32", "--disable-radix-cache"]
server = ServerProcess(flags, Path(tempfile.mkdtemp()) / "server.log").wait_ready(timeout_s=900)
records = []
try:
    group_of_layer = server_layer_groups(server.url)
    for n, item_id in enumerate(ids):
        text = tok.apply_chat_template(build_messages(items[item_id]), add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 1,
                                                          "return_kv_kept": True, "return_kv_roles": True}}
        meta = requests.post(f"{server.url}/generate", json=body, timeout=900).json()["meta_info"]
        kept = [[p for p in g if p < len(prompt)] for g in meta["kv_stats"]["kept_positions"]]
        roles = meta["kv_prompt_roles"]
        answer = tok(full[item_id]["output"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        P, L = len(prompt), len(prompt) + len(answer)

        def ll(kept_sets):
            masks = group_masks(P, L, kept_sets, torch.float32)
            lp, top = replay_logprobs(model, prompt + answer, P, [masks[g] for g in group_of_layer])
            return float(lp.sum()), int((top == torch.tensor(answer)).sum())

        ll_pask, agree_pask = ll(kept)
        ll_full, agree_full = ll([list(range(P))] * len(kept))
        record = {"id": item_id, "prompt": P, "answer": len(answer), "ll_pask": ll_pask, "ll_full": ll_full,
                  "agree_pask": agree_pask, "agree_full": agree_full, "roles": {}}
        rng = random.Random(n)
        for role in sorted(set(roles)):
            dropped = [[p for p in range(P) if roles[p] == role and p not in set(g)] for g in kept]
            count = sum(len(d) for d in dropped)
            if count == 0:
                continue
            restored = [sorted(set(g) | set(d)) for g, d in zip(kept, dropped)]
            others = [[p for p in range(P) if p not in set(g)] for g in kept]
            control = [sorted(set(g) | set(rng.sample(o, len(d)))) for g, o, d in zip(kept, others, dropped)]
            ll_r, agree_r = ll(restored)
            ll_c, agree_c = ll(control)
            record["roles"][role] = {"restored_share": count / (len(kept) * P), "ll": ll_r, "agree": agree_r,
                                     "ll_random": ll_c, "agree_random": agree_c}
        records.append(record)
        gap = ll_full - ll_pask
        print(f"{item_id}: P={P} T={len(answer)} LL pask {ll_pask:.2f} full {ll_full:.2f} agree {agree_pask}/{agree_full}")
        for role, r in record["roles"].items():
            print(f"   {role:20s} share {r['restored_share']:.3f} recovered {(r['ll'] - ll_pask) / gap:+.2f} "
                  f"(random {(r['ll_random'] - ll_pask) / gap:+.2f}) agree {r['agree']} (random {r['agree_random']})",
                  flush=True)
finally:
    server.stop()
Path(out_json).write_text(json.dumps(records, indent=1))
