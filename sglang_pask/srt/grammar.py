"""SGLang's xgrammar backend with a structural role track per request.

:class:`RoleTrackingGrammarBackend` subclasses SGLang's ``XGrammarGrammarBackend`` and is put in its
place by a class-REPLACE hook (:func:`sglang_pask.srt.hooks.register`), so SGLang's own factory
(``create_grammar_backend``) keeps doing everything else it does for ``--grammar-backend xgrammar``
(reasoning-parser wrapping, the fallback for unsupported tokenizers). A backend registered under a
new name with ``register_grammar_backend`` would skip both, which is why the class is replaced
instead.

Masks, acceptance, termination and rollback are exactly xgrammar's: :class:`RoleTrackedGrammar`
tags the tokens the matcher accepted into a :class:`~sglang_pask.structure.RoleTracker` when their
roles are read, so decoding is unchanged and its per-token path gains no work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, List, Optional

from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject, InvalidGrammarObject
from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarObject
from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar, XGrammarGrammarBackend

from sglang_pask.api.error_text import without_source_locations
from sglang_pask.structure import RoleGrammar, RoleTracker, TokenVocab, hf_special_ids

logger = logging.getLogger(__name__)

# SGLang's grammar kinds (GrammarStats.dispatch_type) -> role-grammar kinds.
_ROLE_KIND = {"json": "json", "regex": "regex", "ebnf": "ebnf", "structural_tag": "structural_tag"}

_process_vocab: Optional[TokenVocab] = None
# Output tokens that may stand after the last one the grammar accepted (sampled, not yet accepted).
_TRAILING_TOKENS = 2


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
    """SGLang's ``XGrammarGrammar`` plus the request's role track, tagged when it is read.

    Decoding never waits for tagging: ``accept_token`` is SGLang's own, which records every token the
    matcher accepted in ``accepted_tokens``. :meth:`roles` first tags the tokens accepted since the
    last read, in one loop (:meth:`~sglang_pask.structure.RoleTracker.extend`), so a request whose
    roles nobody reads costs no tagging at all. Invariant: the track has tagged a prefix of
    ``accepted_tokens``; :meth:`rollback` and :meth:`jump_and_retokenize` keep it one.
    """

    def __init__(self, *args: Any, role_grammar: RoleGrammar, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.role_grammar = role_grammar
        self._role_track: RoleTracker = role_grammar.tracker(matcher=self.matcher)

    def roles(self) -> Sequence[int]:
        """Role of every token the matcher accepted, in order (a live view: do not modify)."""
        track, tokens = self._role_track, self.accepted_tokens
        if len(track) < len(tokens):
            track.extend(tokens[len(track) :])
        return track.roles

    def rollback(self, k: int) -> None:
        """SGLang's rollback, and the track's; ``k == 0`` is a no-op (SGLang's own would empty
        ``accepted_tokens``, ``[:-0]``, while the matcher keeps its state)."""
        if k == 0:
            return
        super().rollback(k)
        self._forget_after(len(self.accepted_tokens))

    def jump_and_retokenize(self, old_output_ids: List[int], new_output_ids: List[int], next_state: int) -> None:
        """SGLang's re-tokenization, with ``accepted_tokens`` brought in line with the matcher (SGLang's
        own leaves it unchanged): ``old_output_ids`` are its last tokens, replaced by ``new_output_ids``
        from their first difference on."""
        super().jump_and_retokenize(old_output_ids, new_output_ids, next_state)
        common = 0
        for old_id, new_id in zip(old_output_ids, new_output_ids):
            if old_id != new_id:
                break
            common += 1
        tokens = self.accepted_tokens
        changed_from = max(0, len(tokens) - (len(old_output_ids) - common))
        del tokens[changed_from:]
        tokens.extend(new_output_ids[common:])
        self._forget_after(changed_from)

    def _forget_after(self, n: int) -> None:
        """Roll the track back to its first ``n`` tokens if it has tagged more."""
        excess = len(self._role_track) - n
        if excess > 0:
            self._role_track.rollback(excess)

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


def request_grammar_roles(req: Any) -> tuple[int, Sequence[int]]:
    """The roles of the output tokens a request's grammar accepted, and where the first of them stands.

    Returns ``(offset, roles)``: ``roles[i]`` is the role of ``req.output_ids[offset + i]``. A grammar
    sees the output from its first token, unless SGLang's reasoning parser wrapped it
    (``ReasonerGrammarObject``, ``--reasoning-parser``): then it sees the tokens after the reasoning
    ends (or all of them, if its grammar covers the reasoning too), and its tokens are placed at the
    end of the output, checked token by token. ``(0, [])`` if the request has no role-tracked grammar
    or its tokens are not found there.
    """
    grammar = getattr(req, "grammar", None)
    from_start = True
    if isinstance(grammar, ReasonerGrammarObject):
        from_start = grammar.reasoning_in_grammar
        grammar = grammar.grammar
    if not isinstance(grammar, RoleTrackedGrammar):
        return 0, []
    roles = grammar.roles()
    if from_start:
        return 0, roles
    accepted, output = grammar.accepted_tokens, req.output_ids
    last = len(output) - len(accepted)
    for offset in range(last, max(last - _TRAILING_TOKENS, 0) - 1, -1):
        if list(output[offset : offset + len(accepted)]) == accepted:
            return offset, roles
    return 0, []


class RoleTrackingGrammarBackend(XGrammarGrammarBackend):
    """``XGrammarGrammarBackend`` whose grammars are :class:`RoleTrackedGrammar` objects, and whose
    compile errors (the HTTP 400 a client gets) carry xgrammar's message without the source file and
    line of its C++ code."""

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

    def dispatch_json(self, key_string: str) -> BaseGrammarObject:
        return _without_locations(super().dispatch_json(key_string))

    def dispatch_ebnf(self, key_string: str) -> BaseGrammarObject:
        return _without_locations(super().dispatch_ebnf(key_string))

    def dispatch_regex(self, key_string: str) -> BaseGrammarObject:
        return _without_locations(super().dispatch_regex(key_string))

    def dispatch_structural_tag(self, key_string: str) -> BaseGrammarObject:
        return _without_locations(super().dispatch_structural_tag(key_string))


def _without_locations(grammar: BaseGrammarObject) -> BaseGrammarObject:
    """``grammar``; if it is a compile error, with :func:`without_source_locations` of its message."""
    if isinstance(grammar, InvalidGrammarObject):
        grammar.error_message = without_source_locations(grammar.error_message)
    return grammar
