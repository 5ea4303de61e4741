"""Scratch micro-benchmark (session 42, kept so its figures can be rerun): dequantizing 2-bit blocks
of R requests (900 tokens each, 2 KV heads, head_dim 64, one thread) one request at a time against
all at once, beside a decode SDPA over 1020 tokens per request. The figures in
``memory_2bit_radix_2026-12-06.md`` came from one run while a BFCL run shared the machine (both
sides under the same load). It now dequantizes the kernel of the final code (same arithmetic).

usage (repository root): PYTHONPATH=. .venv/bin/python bench/results/memory_2bit_radix_2026-12-06/dequant_microbench.py
"""
import time, torch
from sglang_pask.kernels.kv_2bit import quantize_key_blocks, quantize_value_blocks, dequantize_key_blocks, dequantize_value_blocks
torch.set_num_threads(1)
H, D, T = 2, 64, 900
for R in (1, 4, 14):
    blocks = -(-T // 32)
    k = torch.randn(R * blocks, 32, H, D, dtype=torch.bfloat16)
    pk, pv = quantize_key_blocks(k), quantize_value_blocks(k)
    def per_request():
        for r in range(R):
            sl = slice(r * blocks, (r + 1) * blocks)
            dequantize_key_blocks(pk[sl], H, D); dequantize_value_blocks(pv[sl], H, D)
    def batched():
        dequantize_key_blocks(pk, H, D); dequantize_value_blocks(pv, H, D)
    q = torch.randn(1, 14, 1, D, dtype=torch.bfloat16)
    kf = torch.randn(1, H, T + 120, D, dtype=torch.bfloat16)
    def attend():
        for r in range(R):
            torch.nn.functional.scaled_dot_product_attention(q, kf, kf, enable_gqa=True)
    for name, fn in (("per_request", per_request), ("batched", batched), ("attend", attend)):
        fn(); t = time.perf_counter()
        for _ in range(20): fn()
        print(R, name, round((time.perf_counter() - t) / 20 * 1000, 2), "ms per layer")
