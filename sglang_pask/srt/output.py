"""What a response's ``meta_info`` gains: the structural roles of its tokens and ``kv_stats``.

The scheduler's output streamer (:class:`PaskOutputStreamer`, a subclass of SGLang's) adds the
fields, by SGLang's own ``customized_info`` channel from the scheduler to the tokenizer manager;
:func:`drop_absent_fields` keeps the ones a request did not get out of its ``meta_info``.

``return_kv_roles``: a request asks with the sampling parameter ``"return_kv_roles": true``
(:mod:`sglang_pask.api.flags`); its response then carries

* ``meta_info["kv_roles"]``: one role label per output token (same length as the output ids), the
  scheduler's role track of the request (:class:`~sglang_pask.srt.grammar.RoleTrackedGrammar`,
  placed by :func:`~sglang_pask.srt.grammar.request_grammar_roles`); tokens no grammar saw (an
  unconstrained request, a reasoning model's thinking) get the grammar-free lexer's roles;
* ``meta_info["kv_prompt_roles"]``: one role label per prompt token.

Both are sent once, with the request's last output (so a revised tentative role is never reported
early). The path is SGLang's own ``customized_info`` channel from the scheduler's output streamer to
the tokenizer manager. Requests that do not ask get nothing added.

``kv_stats`` (:mod:`sglang_pask.api.kv_stats`): every finished request served by a layer-group pool.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

from sglang_pask.api.flags import ROLES_FLAG, wants
from sglang_pask.api.kv_stats import KV_STATS_KEY, STATS_ATTRIBUTE
from sglang_pask.srt.grammar import process_vocab, request_grammar_roles, role_grammar_for
from sglang_pask.structure import LABELS, Role, TokenVocab, tag_prompt_ids

OUTPUT_ROLES_KEY = "kv_roles"
PROMPT_ROLES_KEY = "kv_prompt_roles"
ROLE_KEYS = (OUTPUT_ROLES_KEY, PROMPT_ROLES_KEY)


def output_role_labels(req: Any, vocab: TokenVocab) -> list[str]:
    """One role label per output token of a finished request.

    Tokens the grammar never saw (a reasoning model's thinking before its grammar starts, the stop
    token that ends a grammar-free request, or one sampled after the grammar terminated) are tagged
    by the lexer, like an unconstrained request.
    """
    output_ids = list(req.output_ids)
    offset, grammar_roles = request_grammar_roles(req)
    grammar_roles = list(grammar_roles[: max(len(output_ids) - offset, 0)])
    end = offset + len(grammar_roles)
    roles = _lexer_roles(output_ids[:offset], vocab) + grammar_roles + _lexer_roles(output_ids[end:], vocab)
    return [LABELS[r] for r in roles]


def _lexer_roles(token_ids: list[int], vocab: TokenVocab) -> list[int]:
    """The grammar-free lexer's roles of ``token_ids`` (special tokens are chat-template tokens)."""
    track = role_grammar_for("text", "", vocab).tracker()
    return [int(Role.TEMPLATE) if token in vocab.special_ids else int(track.accept(token)) for token in token_ids]


class RoleReportingOutputStreamer(SchedulerOutputStreamer):
    """SGLang's output streamer plus the two role fields for requests that ask for them."""

    has_additional_customized_info = True

    def build_additional_customized_info(self, reqs: list[Any]) -> dict[str, list[Optional[list[str]]]]:
        vocab = process_vocab()
        fields: dict[str, list[Optional[list[str]]]] = {key: [] for key in ROLE_KEYS}
        for req in reqs:
            ready = vocab is not None and wants(req, ROLES_FLAG) and req.finished()
            fields[OUTPUT_ROLES_KEY].append(output_role_labels(req, vocab) if ready else None)
            fields[PROMPT_ROLES_KEY].append(
                [LABELS[r] for r in tag_prompt_ids(list(req.origin_input_ids), vocab)] if ready else None
            )
        return fields

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key in ROLE_KEYS or super().is_request_level_customized_info_key(key)


class PaskOutputStreamer(RoleReportingOutputStreamer):
    """The role-reporting output streamer plus ``kv_stats`` for finished requests."""

    def build_additional_customized_info(self, reqs: list[Any]) -> dict[str, list[Optional[Any]]]:
        fields: dict[str, list[Optional[Any]]] = super().build_additional_customized_info(reqs)
        stats = [getattr(req, STATS_ATTRIBUTE, None) if req.finished() else None for req in reqs]
        # SGLang accumulates a field's values as a list: send [stats] (unwrapped by the tokenizer side).
        fields[KV_STATS_KEY] = [None if s is None else [s] for s in stats]
        return fields

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key == KV_STATS_KEY or super().is_request_level_customized_info_key(key)


def drop_absent_fields(keys: tuple[str, ...], objects: tuple[str, ...] = ()):
    """An AROUND hook of ``TokenizerManager.update_request_meta_info`` for request-level fields.

    The fields in ``keys`` that a request did not ask for or did not get (None) never reach its
    ``meta_info``. SGLang accumulates each field as a list; the fields in ``objects`` are sent as a
    one-element list ``[value]`` and reach ``meta_info`` as ``value``.
    """

    def drop(
        original: Any, manager: Any, meta_info: dict, state: Any, customized_info: dict, index: int, finish_reason: Any
    ) -> None:
        kept = {key: values for key, values in customized_info.items() if not (key in keys and values[index] is None)}
        original(manager, meta_info, state, kept, index, finish_reason)
        for key in objects:
            if isinstance(meta_info.get(key), list) and meta_info[key]:
                meta_info[key] = meta_info[key][-1]

    return drop
