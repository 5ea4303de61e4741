"""One-off (session 40): would keeping PASK's dropped tokens at 2 bits, instead of not at all, win
back the correct answers, at the same memory?

For calibration items full KV answers correctly (and PASK does not, with ``lost``), full KV's answer is teacher-forced
through transformers (float32, eager): the prompt is computed whole (as the server's prefill), its
cache then altered per layer group, and the answer read from it with each layer's queries masked to
what its group holds. Variants: PASK's kept set at a prompt budget B (the server's, via
return_kv_kept) with the rest dropped; the same kept set with the rest kept as 2-bit keys and values
(asymmetric, one fp16 scale and zero per group of 32: 3 bits an element, 3/16 of bf16's bytes),
values grouped per token over channels, keys either the same way (``2bit``) or per channel over 32
consecutive kept-at-2-bit tokens as KIVI does (``2bit-kivi``); and, for reference, every prompt
token at 2 bits (KIVI's way) but the last 8. Printed: the correct answer's log-likelihood and the steps whose
most likely token is its token.

usage (repository root): PYTHONPATH=. .venv/bin/python lowbit.py BASE_JSON FULL_JSON OUT_JSON lost|correct POLICY@BUDGET ...
(lost: the items full KV answers and PASK's BASE_JSON run does not; correct: every item full KV answers)
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
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import ServerProcess

BITS, GROUP = 2, 32
WINDOW = 8  # --kv-window's default


def fake_quant(x: torch.Tensor) -> torch.Tensor:
    """``(..., d)`` quantized and dequantized in groups of GROUP along the last dimension."""
    shape = x.shape
    g = x.reshape(*shape[:-1], shape[-1] // GROUP, GROUP)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / (2 ** BITS - 1)).clamp_min(1e-8).half().float()
    lo = lo.half().float()
    q = ((g - lo) / scale).round().clamp(0, 2 ** BITS - 1)
    return (q * scale + lo).reshape(shape)


def fake_quant_channels(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, d)`` quantized per channel over groups of GROUP consecutive tokens (KIVI's keys).
    The token axis is padded with copies of its last token (which leaves every group's minimum and
    maximum as they are) and cut back after."""
    b, h, n, d = x.shape
    pad = (-n) % GROUP
    padded = torch.cat([x, x[:, :, -1:].expand(b, h, pad, d)], dim=2)
    grouped = padded.reshape(b, h, (n + pad) // GROUP, GROUP, d).transpose(3, 4)  # (b, h, groups, d, GROUP)
    return fake_quant(grouped).transpose(3, 4).reshape(b, h, n + pad, d)[:, :, :n]


base_json, full_json, out_json, which, *configs = sys.argv[1:]
base = {i["id"]: i for i in json.load(open(base_json))["configs"][0]["items"]}
full = {i["id"]: i for i in json.load(open(full_json))["configs"][0]["items"]}
ids = [i for i in base if full[i]["valid"] and (which == "correct" or not base[i]["valid"])]
items = {item.id: item for item in load_items() if item.id in set(ids)}
model_path = str(ensure_default_model())
tok = AutoTokenizer.from_pretrained(model_path)
model = load_reference(model_path, torch.float32)
prompts = {}
for item_id in ids:
    text = tok.apply_chat_template(build_messages(items[item_id]), add_generation_prompt=True, tokenize=False)
    prompts[item_id] = tok(text, add_special_tokens=False)["input_ids"]

kept_sets: dict[str, dict[str, list[list[int]]]] = {}
for config in configs:
    policy, budget = config.split("@")
    flags = ["--model-path", model_path, "--kv-policy", "pask", "--pask-policy", policy, "--kv-budget", budget,
             "--kv-layer-groups", "4", "--kv-decode", "keep", "--dtype", "float32", "--disable-radix-cache"]
    server = ServerProcess(flags, Path(tempfile.mkdtemp()) / "server.log").wait_ready(timeout_s=900)
    try:
        group_of_layer = server_layer_groups(server.url)
        for item_id in ids:
            body = {"input_ids": prompts[item_id],
                    "sampling_params": {"temperature": 0, "max_new_tokens": 1, "return_kv_kept": True}}
            meta = requests.post(f"{server.url}/generate", json=body, timeout=900).json()["meta_info"]
            kept_sets.setdefault(item_id, {})[budget] = [
                [p for p in g if p < len(prompts[item_id])] for g in meta["kv_stats"]["kept_positions"]]
    finally:
        server.stop()


def answer_ll(prompt, answer, kept, lowbit):
    """LL of ``answer`` and greedy agreement, reading a cache of the whole prompt altered per group."""
    P, T = len(prompt), len(answer)
    cache = DynamicCache()
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0, -1]
    masks = []
    for layer_index, layer in enumerate(cache.layers):
        group = group_of_layer[layer_index]
        if kept is None:
            masks.append(None)
            continue
        dropped = torch.ones(P, dtype=torch.bool)
        dropped[torch.tensor(kept[group], dtype=torch.int64)] = False
        if lowbit:
            quant_keys = fake_quant_channels if lowbit == "kivi" else fake_quant
            layer.keys[:, :, dropped] = quant_keys(layer.keys[:, :, dropped])
            layer.values[:, :, dropped] = fake_quant(layer.values[:, :, dropped])
            masks.append(None)
        else:
            reads = torch.ones(T - 1, P + T - 1, dtype=torch.bool).tril(P)
            reads[:, :P] &= ~dropped
            masks.append(torch.zeros(1, 1, T - 1, P + T - 1).masked_fill(~reads, torch.finfo(torch.float32).min))
    handles = []
    for layer, mask in zip(model.model.layers, masks):
        if mask is not None:
            handles.append(layer.self_attn.register_forward_pre_hook(
                lambda m, a, k, mask=mask: (a, {**k, "attention_mask": mask}), with_kwargs=True))
    try:
        with torch.no_grad():
            rest = model(input_ids=torch.tensor([answer[:-1]]), past_key_values=cache, use_cache=True).logits[0]
    finally:
        for h in handles:
            h.remove()
    logits = torch.cat([first[None], rest]).double().log_softmax(-1)
    target = torch.tensor(answer)
    return float(logits.gather(1, target[:, None]).sum()), int((logits.argmax(-1) == target).sum())


records = []
for item_id in ids:
    prompt = prompts[item_id]
    answer = tok(full[item_id]["output"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    record = {"id": item_id, "prompt": len(prompt), "answer": len(answer), "full": answer_ll(prompt, answer, None, False)}
    # Every prompt token at 2 bits but the last WINDOW (the window every policy keeps), for reference.
    window_only = [list(range(len(prompt) - WINDOW, len(prompt)))] * 4
    record["2bit-kivi, all but the window"] = answer_ll(prompt, answer, window_only, "kivi")
    for budget, kept in kept_sets[item_id].items():
        record[f"drop@{budget}"] = answer_ll(prompt, answer, kept, False)
        record[f"2bit@{budget}"] = answer_ll(prompt, answer, kept, "token")
        record[f"2bit-kivi@{budget}"] = answer_ll(prompt, answer, kept, "kivi")
    records.append(record)
    print(json.dumps(record), flush=True)
Path(out_json).write_text(json.dumps(records, indent=1))
