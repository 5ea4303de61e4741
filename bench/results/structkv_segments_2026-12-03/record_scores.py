"""One-off: every layer's window scores (window 32, transformers, float32) of long-context prompts, with
their segment ids and the answer's token positions, saved for kv_keep_rules.py and kv_segment_scores.py.

    PYTHONPATH=. .venv/bin/python bench/results/structkv_segments_2026-12-03/record_scores.py niah-mv 2048 6 OUT.pt
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from bench.long_context import build_items
from bench.pivot_profile import WindowScoreRecorder, key_positions
from sglang_pask.default_model import ensure_default_model
from sglang_pask.structkv import segment_end_table, segment_ids
from sglang_pask.structure import TokenVocab
tasks, length, items, out = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mp = str(ensure_default_model()); tok = AutoTokenizer.from_pretrained(mp)
vocab = TokenVocab.from_huggingface(tok); table = segment_end_table(vocab.token_bytes, vocab.special_ids)
rec = WindowScoreRecorder(ALL_ATTENTION_FUNCTIONS["sdpa"], 32, 8); ALL_ATTENTION_FUNCTIONS["sdpa"] = rec
model = AutoModelForCausalLM.from_pretrained(mp, dtype=torch.float32, attn_implementation="sdpa").eval()
rows = []
for it in build_items(tok, tasks, [length], items):
    ids = tok(it.text, return_tensors="pt")["input_ids"]
    rec.scores.clear()
    with torch.no_grad(): model(ids)
    rows.append({"task": it.task, "scores": torch.stack(list(rec.scores)), "segments": segment_ids(table[ids[0]]),
                 "keys": key_positions(tok, it.text, it.expected), "expected": it.expected})
    print(len(rows), flush=True)
torch.save(rows, out)
