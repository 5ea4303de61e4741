"""SGLang's xgrammar backend with a structural role track per request.

:class:`RoleTrackingGrammarBackend` subclasses SGLang's ``XGrammarGrammarBackend`` and is put in its
place by a class-REPLACE hook (:func:`sglang_pask.srt.hooks.register`), so SGLang's own factory
(``create_grammar_backend``) keeps doing everything else it does for ``--grammar-backend xgrammar``
(reasoning-parser wrapping, the fallback for unsupported tokenizers). A backend registered under a
new name with ``register_grammar_backend`` would skip both, which is why the class is replaced
instead.

Masks, acceptance, termination and rollback are exactly xgrammar's: :class:`RoleTrackedGrammar`
only mirrors every token the matcher accepts (and every rollback) into a
:class:`~sglang_pask.structure.RoleTracker`, so decoding is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar, XGrammarGrammarBackend

from sglang_pask.structure import RoleGrammar, RoleTracker, TokenVocab, hf_special_ids

logger = logging.getLogger(__name__)

# SGLang's grammar kinds (GrammarStats.dispatch_type) -> role-grammar kinds.
_ROLE_KIND = {"json": "json", "regex": "regex", "ebnf": "ebnf", "structural_tag": "structural_tag"}

_process_vocab: Optional[TokenVocab] = None


def process_vocab() -> Optional[TokenVocab]:
    """The token vocabulary of this scheduler process's model (set when the grammar backend is built)."""
    return _process_vocab


def role_grammar_for(kind: str, key_string: str, vocab: TokenVocab) -> RoleGrammar:
    """The role grammar of a request grammar; the grammar-free lexer if its text cannot be analysed.

    Role tagging must never refuse a request that xgrammar accepted, so any analysis error (a
    ValueError for grammar features it does not read, or a bug) only downgrades the roles and is
    logged; the request is served as stock SGLang would serve it.
    """
    role_kind = _ROLE_KIND.get(kind, "text")
    try:
        return RoleGrammar.compile(role_kind, key_string, vocab)
    except ValueError as err:
        logger.warning("sglang-pask: %s grammar roles fall back to the lexer: %s", kind, err)
    except Exception:  # noqa: BLE001 - auxiliary analysis must not fail a request xgrammar accepted
        logger.exception("sglang-pask: role analysis of a %s grammar failed; using the lexer", kind)
    return RoleGrammar.compile("text", "", vocab)


class RoleTrackedGrammar(XGrammarGrammar):
    """SGLang's ``XGrammarGrammar`` plus the request's role track (``self.role_tracker``)."""

    def __init__(self, *args: Any, role_grammar: RoleGrammar, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.role_grammar = role_grammar
        self.role_tracker: RoleTracker = role_grammar.tracker(matcher=self.matcher)

    def accept_token(self, token: int) -> None:
        accepted_before = len(self.accepted_tokens)
        super().accept_token(token)
        if len(self.accepted_tokens) > accepted_before:  # xgrammar ignores tokens after termination
            self.role_tracker.accept(token)

    def rollback(self, k: int) -> None:
        super().rollback(k)
        self.role_tracker.rollback(k)

    def jump_and_retokenize(self, old_output_ids: List[int], new_output_ids: List[int], next_state: int) -> None:
        super().jump_and_retokenize(old_output_ids, new_output_ids, next_state)
        common = 0
        for old_id, new_id in zip(old_output_ids, new_output_ids):
            if old_id != new_id:
                break
            common += 1
        if common < len(old_output_ids):
            self.role_tracker.rollback(len(old_output_ids) - common)
        for token in new_output_ids[common:]:
            self.role_tracker.accept(token)

    def copy(self) -> "RoleTrackedGrammar":
        fresh = super().copy()
        return RoleTrackedGrammar(
            fresh.matcher,
            fresh.vocab_size,
            fresh.ctx,
            fresh.override_stop_tokens,
            fresh.key_string,
            fresh.grammar_stats,
            role_grammar=self.role_grammar,
        )


class RoleTrackingGrammarBackend(XGrammarGrammarBackend):
    """``XGrammarGrammarBackend`` whose grammars are :class:`RoleTrackedGrammar` objects."""

    def __init__(self, tokenizer: Any, vocab_size: int, *args: Any, **kwargs: Any) -> None:
        global _process_vocab
        super().__init__(tokenizer, vocab_size, *args, **kwargs)
        extra = set(hf_special_ids(tokenizer)) if hasattr(tokenizer, "all_special_ids") else set()
        stop = self.override_stop_tokens
        extra.update([stop] if isinstance(stop, int) else (stop or ()))
        self.role_vocab = TokenVocab.from_xgrammar(self._tokenizer_info, extra_special_ids=extra)
        _process_vocab = self.role_vocab

    def _from_context(self, ctx: Any, key_string: str, grammar_stats: Any) -> RoleTrackedGrammar:
        plain = super()._from_context(ctx, key_string, grammar_stats)
        kind = getattr(grammar_stats, "dispatch_type", None) or "text"
        return RoleTrackedGrammar(
            plain.matcher,
            plain.vocab_size,
            plain.ctx,
            plain.override_stop_tokens,
            plain.key_string,
            plain.grammar_stats,
            role_grammar=role_grammar_for(kind, key_string, self.role_vocab),
        )
