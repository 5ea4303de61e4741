"""The bytes each token id stands for, as the grammar matcher sees them.

Role tracking works on bytes, not decoded strings: a byte-level BPE token may hold half of a UTF-8
character, and decoding it alone gives a replacement character. xgrammar's ``TokenizerInfo`` already
holds exactly the bytes its matcher consumes per token (``decoded_vocab``), so that is the source.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenVocab:
    """Bytes per token id plus the ids of special tokens.

    Parameters
    ----------
    token_bytes
        ``token_bytes[i]`` is the text of token ``i`` as UTF-8 bytes.
    special_ids
        Special tokens (stop tokens, chat-template markers). Generated, they get role ``TEMPLATE`` and
        leave the tracker's parser state unchanged.

    Attributes
    ----------
    walk_bytes
        Built once with the vocabulary (like xgrammar's ``TokenizerInfo`` tables): the bytes a role
        machine walks per token id, empty for special tokens, so that tagging a token needs one
        index instead of a lookup in ``special_ids``.
    """

    token_bytes: Sequence[bytes]
    special_ids: frozenset[int]
    walk_bytes: tuple[bytes, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        special = self.special_ids
        walk = tuple(b"" if i in special else data for i, data in enumerate(self.token_bytes))
        object.__setattr__(self, "walk_bytes", walk)

    def __len__(self) -> int:
        return len(self.token_bytes)

    def text(self, token_id: int) -> bytes:
        """Bytes of ``token_id``.

        Raises
        ------
        ValueError
            If the id is outside the vocabulary.
        """
        if not 0 <= token_id < len(self.token_bytes):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(self.token_bytes)})")
        return self.token_bytes[token_id]

    @classmethod
    def from_xgrammar(cls, tokenizer_info: Any, extra_special_ids: Iterable[int] = ()) -> TokenVocab:
        """From an ``xgrammar.TokenizerInfo`` (its ``decoded_vocab``, stop and special token ids)."""
        special = set(tokenizer_info.special_token_ids) | set(tokenizer_info.stop_token_ids)
        special.update(extra_special_ids)
        return cls(tuple(tokenizer_info.decoded_vocab), frozenset(special))

    @classmethod
    def from_huggingface(cls, tokenizer: Any, vocab_size: int | None = None) -> TokenVocab:
        """From a Hugging Face tokenizer, through ``xgrammar.TokenizerInfo.from_huggingface``.

        The tokenizer's special tokens count as special (see :func:`hf_special_ids`).
        """
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size if vocab_size is not None else len(tokenizer)
        )
        return cls.from_xgrammar(info, extra_special_ids=hf_special_ids(tokenizer))


def hf_special_ids(tokenizer: Any) -> set[int]:
    """Ids of a Hugging Face tokenizer's special tokens.

    ``all_special_ids`` can miss chat-template markers (a Qwen2.5 tokenizer converted from GGUF lists
    only ``<|endoftext|>`` and ``<|im_end|>`` there), so added tokens flagged special count too.
    """
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special)
    return ids


def hf_special_tokens(tokenizer: Any) -> list[str]:
    """Strings of :func:`hf_special_ids` (for :func:`.prompt.tag_prompt`)."""
    return tokenizer.convert_ids_to_tokens(sorted(hf_special_ids(tokenizer)))
