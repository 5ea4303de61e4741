"""Build a tiny, deterministic, random-weight Qwen3 (or Qwen2, Llama) model around the project's toy tokenizer.

For mechanics only (serving, grammars, KV bookkeeping): its outputs are meaningless text. The
tokenizer is :func:`sglang_pask.structure.toy_tokenizer.build_toy_tokenizer` (byte-level BPE, vocab
4096, ChatML specials, a chat template that renders OpenAI ``tools``); the model has 2 layers,
hidden size 128, 4 query / 2 KV heads (head_dim 32), bf16, seeded weights (initializer range 0.3,
so greedy continuations are varied enough to compare engines).
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_pask.structure.toy_tokenizer import build_toy_tokenizer

ARCHITECTURES = ("qwen3", "qwen2", "llama")


def build_tiny_model(out: Path, num_layers: int = 2, arch: str = "qwen3") -> Path:
    """Write the tokenizer and the model (``num_layers`` layers of ``arch``, one of
    :data:`ARCHITECTURES`) into ``out`` (created) and return it."""
    import torch
    import transformers

    config_class, model_class = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[arch]

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_toy_tokenizer()
    tokenizer.eos_token = "<|im_end|>"  # ChatML chat models stop on the end of their turn
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.3,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(out)
    generation = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out
