"""Scratch diagnosis (session 42, kept so its figures can be rerun): relative error of the 2-bit
round trip of real K/V (one 576-token prompt, layers 0, 5, 12, 23) with the kernel's value format
against per-token groups without a rotation. Run at 9ec1f0f, whose kernel rotated values; at later
commits the kernel no longer rotates, so its "rot" column equals "unrot" there.

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/pask_2bit_rotation_calib_2026-12-06/value_error.py
"""
import torch, sys
from transformers import AutoTokenizer, DynamicCache
from bench.kept_set_reference import load_reference
from sglang_pask.default_model import ensure_default_model
from sglang_pask.kernels import kv_2bit as K
torch.set_num_threads(1)
mp = str(ensure_default_model()); tok = AutoTokenizer.from_pretrained(mp); model = load_reference(mp, torch.float32)
text = "You are an expert in composing functions. " + " ".join(f"Function f{i}(x, y) returns the {i}th combination of x and y." for i in range(30))
ids = tok(text)["input_ids"][:640]
cache = DynamicCache()
with torch.no_grad(): model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
def unrot(v):
    b,t,h,d = v.shape
    g = v.reshape(b,t,h,d//32,32)
    c,s,z = K._quantize_groups(g)
    return (c.float()*s.float().unsqueeze(-1)+z.float().unsqueeze(-1)).reshape(v.shape)
for li in [0, 5, 12, 23]:
    v = cache.layers[li].values[0].permute(1,0,2)  # (T, h, d)
    blocks = v[:576].reshape(-1, 32, v.shape[1], v.shape[2])
    rot = K.dequantize_value_blocks(K.quantize_value_blocks(blocks), v.shape[1], v.shape[2])
    un = unrot(blocks)
    k = cache.layers[li].keys[0].permute(1,0,2)[:576].reshape(-1,32,v.shape[1],v.shape[2])
    kq = K.dequantize_key_blocks(K.quantize_key_blocks(k), v.shape[1], v.shape[2])
    print(li, "value rel err rot", float((rot-blocks).norm()/blocks.norm()), "unrot", float((un-blocks).norm()/blocks.norm()), "key rel err", float((kq-k).norm()/k.norm()))
