"""Fixtures for the structure tests (the toy tokenizer, its vocabulary and compiler: ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


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
