"""Roles of prompt tokens: chat-template markers, system text, the user's question, tool schemas.

A prompt is tagged per character, then each token takes the highest-priority role among its
characters (:data:`.roles.PRIORITY`).

1. Chat template. Special-token strings are ``TEMPLATE``. A role header right after one (ChatML
   ``<|im_start|>user\\n``, Llama-3 ``<|start_header_id|>user<|end_header_id|>\\n\\n``, Gemma
   ``<start_of_turn>user\\n``) is ``TEMPLATE`` and sets the role of the text that follows, up to the
   next header: ``system`` / ``developer`` give ``SYSTEM_TEXT``, ``user`` gives ``USER_QUESTION``,
   other speakers (assistant, tool) ``FREE_TEXT``. Newlines right after a special token are
   ``TEMPLATE``. Text before any header is ``FREE_TEXT``.
2. Tool schemas. Every JSON value in the text that is a function doc (OpenAI ``tools`` entry or
   function, BFCL doc), or a list of them, wherever the template or the system prompt put it and
   however it was serialized, gets schema roles: function name, parameter names (keys of
   ``properties``), ``required`` entries, types and type constraints, ``enum`` entries, descriptions;
   its punctuation and schema keywords are ``BOUNDARY``, its whitespace ``WHITESPACE``. When
   ``tools`` is given, only docs whose function name is among the given tools count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .function_docs import function_doc
from .json_spans import JsonNode, iter_json
from .roles import RANK, ROLE_OF_RANK, Role
from .vocab import TokenVocab

_HEADER_ROLES = {
    "system": Role.SYSTEM_TEXT,
    "developer": Role.SYSTEM_TEXT,
    "user": Role.USER_QUESTION,
    "human": Role.USER_QUESTION,
    "assistant": Role.FREE_TEXT,
    "model": Role.FREE_TEXT,
    "tool": Role.FREE_TEXT,
    "ipython": Role.FREE_TEXT,
    "function": Role.FREE_TEXT,
}
_HEADER_RE = re.compile(r"[ \t]*(" + "|".join(_HEADER_ROLES) + r")\b[ \t]*")
_NEWLINES_RE = re.compile(r"[\r\n]+")
_WS_RE = re.compile(r"\s+")
_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 continuation bytes
_RANK_TABLE = bytes(RANK[i] if i < len(RANK) else 0 for i in range(256))

_TYPE_KEYS = frozenset({"type", "format", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                        "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "multipleOf",
                        "minProperties", "maxProperties"})  # fmt: skip
_DESCRIPTION_KEYS = frozenset({"description", "title"})
_EXAMPLE_KEYS = frozenset({"default", "example", "examples"})
_QUOTED_EXAMPLE_RE = re.compile(r"""(?<![^\W_])(?:'([^'\n]{1,80})'|\\"((?:[^"\\\n]|\\[^"\n]){1,80})\\")(?![^\W_])""")
_MARKED_EXAMPLE_RE = re.compile(
    r"\b(?:e\.g\.|for example|for instance|such as)[,:]?[ \t]*([^\s.;)\\](?:[^.;)\n\\]|\.(?![ \t]|$)){0,79})",
    re.IGNORECASE,
)
_SCHEMA_KEYS = frozenset({"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"})
_SCHEMA_LIST_KEYS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})


def _fill(roles: bytearray, start: int, end: int, role: int) -> None:
    if end > start:
        roles[start:end] = bytes((role,)) * (end - start)


def _content(roles: bytearray, node: JsonNode, role: int) -> None:
    """``role`` for a scalar's characters (a string's quotes stay BOUNDARY)."""
    if node.kind == "string":
        _fill(roles, node.start + 1, node.end - 1, role)
    elif node.kind == "scalar":
        _fill(roles, node.start, node.end, role)
    else:
        for child in node.items:
            _content(roles, child, role)
        for key, value in node.members:
            _content(roles, key, role)
            _content(roles, value, role)


def _description(text: str, roles: bytearray, node: JsonNode) -> None:
    """``SCHEMA_DESCRIPTION`` for a description's characters, ``SCHEMA_EXAMPLE`` for its examples."""
    _content(roles, node, Role.SCHEMA_DESCRIPTION)
    if node.kind != "string":
        return
    start, end = node.start + 1, node.end - 1
    for pattern in (_QUOTED_EXAMPLE_RE, _MARKED_EXAMPLE_RE):
        for m in pattern.finditer(text, start, end):
            group = 1 if m.start(1) >= 0 else 2
            _fill(roles, m.start(group), m.end(group), Role.SCHEMA_EXAMPLE)


def _schema(text: str, roles: bytearray, node: JsonNode) -> None:
    """Roles inside a parameter schema object."""
    if node.kind == "array":
        for item in node.items:
            _schema(text, roles, item)
        return
    if node.kind != "object":
        return
    for key, value in node.members:
        name = key.value
        if name == "properties" and value.kind == "object":
            for pkey, pvalue in value.members:
                _content(roles, pkey, Role.SCHEMA_PARAM_NAME)
                _schema(text, roles, pvalue)
        elif name == "required":
            _content(roles, value, Role.SCHEMA_REQUIRED)
        elif name in ("enum", "const"):
            _content(roles, value, Role.SCHEMA_ENUM)
        elif name in _TYPE_KEYS:
            _content(roles, value, Role.SCHEMA_TYPE)
        elif name in _DESCRIPTION_KEYS:
            _description(text, roles, value)
        elif name in _EXAMPLE_KEYS:
            _content(roles, value, Role.SCHEMA_EXAMPLE)
        elif name in ("$defs", "definitions") and value.kind == "object":
            for dkey, dvalue in value.members:
                _content(roles, dkey, Role.SCHEMA_TYPE)
                _schema(text, roles, dvalue)
        elif name in _SCHEMA_KEYS or name in _SCHEMA_LIST_KEYS:
            _schema(text, roles, value)


def _doc(text: str, roles: bytearray, node: JsonNode) -> None:
    """Roles inside a function doc object (or an OpenAI tool wrapping one)."""
    for key, value in node.members:
        name = key.value
        if name == "function" and value.kind == "object":
            _doc(text, roles, value)
        elif name == "name":
            _content(roles, value, Role.SCHEMA_FUNC_NAME)
        elif name == "description":
            _description(text, roles, value)
        elif name != "type":
            _schema(text, roles, value)


def _plain(node: JsonNode) -> Any:
    """The Python value of a node (for :func:`.function_docs.function_doc`)."""
    if node.kind == "object":
        return {k.value: _plain(v) for k, v in node.members}
    if node.kind == "array":
        return [_plain(i) for i in node.items]
    return node.value


def _docs_in(node: JsonNode, names: set[str] | None) -> list[JsonNode]:
    """Function-doc object nodes in ``node`` (itself, or nested in arrays / objects)."""
    if node.kind == "object":
        fn = function_doc(_plain(node))
        if fn is not None and (names is None or fn["name"] in names):
            return [node]
        return [d for _, v in node.members for d in _docs_in(v, names)]
    if node.kind == "array":
        return [d for item in node.items for d in _docs_in(item, names)]
    return []


def function_doc_spans(text: str, tools: Iterable[Any] | None = None) -> list[JsonNode]:
    """Function-doc JSON objects inside ``text`` with their spans, left to right.

    Parameters
    ----------
    tools
        If given (OpenAI tools or function docs), only docs of functions with these names.
    """
    names = None
    if tools is not None:
        names = set()
        for tool in tools:
            fn = function_doc(tool)
            if fn is None:
                raise ValueError(f"not a tool / function doc: {tool!r:.200}")
            names.add(fn["name"])
    return [doc for node in iter_json(text) for doc in _docs_in(node, names)]


def find_function_docs(text: str) -> list[dict[str, Any]]:
    """The function docs serialized in ``text`` (a prompt), as dicts, left to right.

    For a call-syntax grammar whose text does not say which arguments are required, pass these to
    :meth:`.tracker.RoleGrammar.compile` (``functions=``).
    """
    return [_plain(node) for node in function_doc_spans(text)]


def _template_roles(text: str, roles: bytearray, special_tokens: Iterable[str]) -> None:
    specials = sorted({s for s in special_tokens if s}, key=len, reverse=True)
    if not specials:
        return
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    region = int(Role.FREE_TEXT)
    pos = 0
    for m in pattern.finditer(text):
        _fill(roles, pos, m.start(), region)
        _fill(roles, m.start(), m.end(), Role.TEMPLATE)
        pos = m.end()
        header = _HEADER_RE.match(text, pos)
        if header is not None:
            end = header.end()
            if end == len(text) or text[end] in "\r\n" or pattern.match(text, end):
                region = int(_HEADER_ROLES[header.group(1)])
                _fill(roles, pos, end, Role.TEMPLATE)
                pos = end
        newlines = _NEWLINES_RE.match(text, pos)
        if newlines is not None:
            _fill(roles, pos, newlines.end(), Role.TEMPLATE)
            pos = newlines.end()
    _fill(roles, pos, len(text), region)


def char_roles(text: str, special_tokens: Iterable[str] = (), tools: Iterable[Any] | None = None) -> bytearray:
    """Role of every character of ``text`` (see the module docstring)."""
    roles = bytearray([Role.FREE_TEXT]) * len(text)
    _template_roles(text, roles, special_tokens)
    for doc in function_doc_spans(text, tools):
        _fill(roles, doc.start, doc.end, Role.BOUNDARY)
        for m in _WS_RE.finditer(text, doc.start, doc.end):
            _fill(roles, m.start(), m.end(), Role.WHITESPACE)
        _doc(text, roles, doc)
    return roles


def token_roles(roles: bytearray, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """One role per token from character roles; a token without characters is ``TEMPLATE``."""
    ranks = roles.translate(_RANK_TABLE)
    template = int(Role.TEMPLATE)
    return [ROLE_OF_RANK[max(ranks[s:e])] if e > s else template for s, e in offsets]


def tag_prompt(
    text: str,
    offsets: Sequence[tuple[int, int]],
    special_tokens: Iterable[str] = (),
    tools: Iterable[Any] | None = None,
) -> list[int]:
    """Role of every prompt token.

    Parameters
    ----------
    text
        The prompt after the chat template.
    offsets
        Character span of each token in ``text`` (a Hugging Face fast tokenizer's
        ``return_offsets_mapping=True``).
    special_tokens
        Strings of the tokenizer's special tokens (:func:`.vocab.hf_special_tokens`).
    tools
        The request's tools / function docs, if known (see :func:`function_doc_spans`).
    """
    return token_roles(char_roles(text, special_tokens, tools), offsets)


def tag_prompt_ids(token_ids: Sequence[int], vocab: TokenVocab, tools: Iterable[Any] | None = None) -> list[int]:
    """Role of every prompt token, from token ids alone (the text is rebuilt from ``vocab``).

    Special tokens are ``TEMPLATE``; their text marks the chat template as in :func:`tag_prompt`.
    """
    pieces = [vocab.text(t) for t in token_ids]
    data = b"".join(pieces)
    try:
        text = data.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        text = data.decode("latin-1")
        utf8 = False
    offsets: list[tuple[int, int]] = []
    chars = 0
    for piece in pieces:
        if utf8:
            leads = len(piece.translate(None, _CONTINUATION))  # bytes that start a character
            start = chars - (1 if piece and 0x80 <= piece[0] < 0xC0 else 0)
        else:
            leads = len(piece)
            start = chars
        chars += leads
        offsets.append((start, chars))
    specials = {vocab.token_bytes[t].decode("utf-8", "replace") for t in set(token_ids) & vocab.special_ids}
    roles = token_roles(char_roles(text, specials, tools), offsets)
    template = int(Role.TEMPLATE)
    return [template if t in vocab.special_ids else r for t, r in zip(token_ids, roles)]
