"""Fixtures for the structure tests: a real (small) tokenizer and its xgrammar compiler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sglang_pask.structure.toy_tokenizer import build_toy_tokenizer
from sglang_pask.structure.vocab import TokenVocab

import xgrammar  # noqa: E402


@pytest.fixture(scope="session")
def tok() -> Any:
    return build_toy_tokenizer()


@pytest.fixture(scope="session")
def vocab(tok: Any) -> TokenVocab:
    return TokenVocab.from_huggingface(tok)


@pytest.fixture(scope="session")
def compiler(tok: Any) -> Any:
    info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    return xgrammar.GrammarCompiler(info, max_threads=1)


@pytest.fixture(scope="session")
def encode(tok: Any) -> Callable[[str], tuple[list[int], list[tuple[int, int]]]]:
    def _encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]

    return _encode


@pytest.fixture(scope="session")
def qwen_tok() -> Any:
    """The default model's tokenizer (Qwen2.5-Coder, 151k tokens), preparing the model if needed."""
    from transformers import AutoTokenizer

    from sglang_pask.default_model import ensure_default_model

    return AutoTokenizer.from_pretrained(ensure_default_model())
