"""One-off (session 42): would rotating K/V by a Hadamard matrix before 2-bit quantization (as
QuaRot/QuIP# do for outliers) bring PASK 0.12 + 2-bit closer to full KV, at the same bytes?

Calibration items full KV answers correctly; full KV's answer teacher-forced through transformers
(float32, eager): the prompt computed whole, then in each layer the positions outside the server's
kept set for that layer's group (PASK at 0.12, ``keep012.json``, via ``return_kv_kept``) replaced by
their 2-bit round trip, and the answer read from that cache. Variants of the round trip (all 3 bits
an element with the fp16 scale and zero of each group of 32, as ``kernels/kv_2bit.py``):

* ``kivi``: keys per channel over 32 consecutive quantized tokens, values per token over groups of
  32 channels (what the server does);
* ``kivi+rot-v``: the same, values rotated by the orthonormal Hadamard matrix of head_dim first and
  rotated back after;
* ``kivi+rot-kv``: keys rotated too, then quantized per (rotated) channel.

Printed per item: the correct answer's log-likelihood and the steps whose most likely token is its
token, for full KV and each variant.

usage (repository root): PYTHONPATH=. .venv/bin/python rotation.py FULL_JSON POLICY BUDGET OUT_JSON
"""
import json
import sys
import tempfile
from pathlib import Path

import requests
import torch
from transformers import AutoTokenizer, DynamicCache

from bench.kept_set_reference import load_reference, server_layer_groups
from sglang_pask.bfcl.data import load_items
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.bfcl.split import load_calibration_ids
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import ServerProcess

GROUP, LEVELS = 32, 3


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` through asymmetric 2-bit groups of the last dimension (fp16 scale and zero)."""
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / LEVELS).clamp_min(1e-8).half().float()
    lo = lo.half().float()
    return ((x - lo) / scale).round().clamp(0, LEVELS) * scale + lo


def per_token(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, d)`` per token over groups of GROUP channels."""
    b, h, n, d = x.shape
    return round_trip(x.reshape(b, h, n, d // GROUP, GROUP)).reshape(b, h, n, d)


def per_channel(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, d)`` per channel over groups of GROUP consecutive tokens (last group padded with
    copies of the last token, which leaves its minimum and maximum as they are)."""
    b, h, n, d = x.shape
    pad = (-n) % GROUP
    padded = torch.cat([x, x[:, :, -1:].expand(b, h, pad, d)], dim=2)
    grouped = padded.reshape(b, h, (n + pad) // GROUP, GROUP, d).transpose(3, 4)
    return round_trip(grouped).transpose(3, 4).reshape(b, h, n + pad, d)[:, :, :n]


def hadamard(d: int) -> torch.Tensor:
    """``(d, d)`` orthonormal Hadamard matrix (Sylvester), ``d`` a power of two."""
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


def rotated(quantize, rotation):
    return lambda x: quantize(x @ rotation) @ rotation.T


full_json, policy, budget, out_json = sys.argv[1:]
full = {i["id"]: i for i in json.load(open(full_json))["configs"][0]["items"]}
calibration = load_calibration_ids()
ids = [i for i in full if full[i]["valid"] and i in calibration]
items = {item.id: item for item in load_items() if item.id in set(ids)}
model_path = str(ensure_default_model())
tok = AutoTokenizer.from_pretrained(model_path)
model = load_reference(model_path, torch.float32)
prompts = {}
for item_id in ids:
    text = tok.apply_chat_template(build_messages(items[item_id]), add_generation_prompt=True, tokenize=False)
    prompts[item_id] = tok(text, add_special_tokens=False)["input_ids"]

flags = ["--model-path", model_path, "--kv-policy", "pask", "--pask-policy", policy, "--kv-budget", budget,
         "--kv-layer-groups", "4", "--kv-decode", "keep", "--kv-dropped", "2bit", "--dtype", "float32",
         "--disable-radix-cache"]
server = ServerProcess(flags, Path(tempfile.mkdtemp()) / "server.log").wait_ready(timeout_s=900)
kept_sets = {}
try:
    group_of_layer = server_layer_groups(server.url)
    for item_id in ids:
        body = {"input_ids": prompts[item_id],
                "sampling_params": {"temperature": 0, "max_new_tokens": 1, "return_kv_kept": True}}
        meta = requests.post(f"{server.url}/generate", json=body, timeout=900).json()["meta_info"]
        kept_sets[item_id] = [[p for p in g if p < len(prompts[item_id])] for g in meta["kv_stats"]["kept_positions"]]
finally:
    server.stop()

head_dim = model.config.hidden_size // model.config.num_attention_heads
H = hadamard(head_dim)
VARIANTS = {
    "kivi": (per_channel, per_token),
    "kivi+rot-v": (per_channel, rotated(per_token, H)),
    "kivi+rot-kv": (rotated(per_channel, H), rotated(per_token, H)),
}


def answer_ll(prompt, answer, kept, variant):
    """LL of ``answer`` and greedy agreement, reading the prompt's cache with each layer's
    positions outside its group's kept set through ``variant``'s round trip (None: full KV)."""
    cache = DynamicCache()
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0, -1]
        if variant is not None:
            keys_q, values_q = VARIANTS[variant]
            for layer_index, layer in enumerate(cache.layers):
                low = torch.ones(len(prompt), dtype=torch.bool)
                low[torch.tensor(kept[group_of_layer[layer_index]], dtype=torch.int64)] = False
                layer.keys[:, :, low] = keys_q(layer.keys[:, :, low])
                layer.values[:, :, low] = values_q(layer.values[:, :, low])
        rest = model(input_ids=torch.tensor([answer[:-1]]), past_key_values=cache, use_cache=True).logits[0]
    logits = torch.cat([first[None], rest]).double().log_softmax(-1)
    target = torch.tensor(answer)
    return float(logits.gather(1, target[:, None]).sum()), int((logits.argmax(-1) == target).sum())


records = []
for item_id in ids:
    prompt = prompts[item_id]
    answer = tok(full[item_id]["output"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    record = {"id": item_id, "prompt": len(prompt), "answer": len(answer), "full": answer_ll(prompt, answer, None, None)}
    for variant in VARIANTS:
        record[variant] = answer_ll(prompt, answer, kept_sets[item_id], variant)
    records.append(record)
    print(json.dumps(record), flush=True)
Path(out_json).write_text(json.dumps(records, indent=1))
print("done")
