"""Role machine for SGLang's structural tags: tool calls framed by the model's own markup.

With a tool-call parser (``--tool-call-parser qwen25`` and others), SGLang constrains the OpenAI
tools path with an xgrammar *structural tag*. Two forms reach the grammar backend as JSON:

- legacy: ``{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...], "at_least_one"}``
  (qwen25 / hermes / llama3 / mistral parsers), which xgrammar reads as ``triggered_tags``: free text,
  and wherever a trigger appears, one tag ``begin + JSON(schema) + end``;
- ``{"type": "structural_tag", "format": {...}}`` with nested formats (model-native tags).

Roles
-----
- free text outside tags: ``FREE_TEXT`` (whitespace ``WHITESPACE``);
- a tag's begin / end strings and constant strings: chat-template markup (``<tool_call>``,
  ``<|channel|>commentary``) is ``TEMPLATE``, whitespace ``WHITESPACE``, punctuation ``BOUNDARY``. A JSON
  envelope in a begin string (``{"name":"get_weather", "arguments":``) is read as JSON: its keys and
  punctuation are ``BOUNDARY`` and the value of ``name`` is ``FUNC_NAME``; so is a name in markup
  attributes (``name="f"``, ``function=f``, ``functions.f``);
- a tag's JSON content: :mod:`.json_roles` with the tag's schema (argument keys, required keys,
  values by type, enums);
- ``any_text`` content: ``FREE_TEXT``.

While free text spells a prefix of a trigger, its tokens carry the trigger's role tentatively and
are revised to ``FREE_TEXT`` if the trigger does not complete (see :mod:`.scan`).

Supported formats: ``const_string``, ``json_schema`` (style ``json``), ``any_text`` (followed by a
string or the end of output), ``sequence``, ``tag`` (string begin and end), ``triggered_tags`` and
``tags_with_separator``. Other formats raise ``ValueError`` (the caller then falls back to the
grammar-free lexer).

How it runs
-----------
The format compiles into a graph of nodes: *string* nodes (a choice between fixed strings, each
leading to a node; optionally an epsilon exit to a following node), *json* nodes (a JSON value, then
a node) and *text* nodes (free text that leaves through one of its exit strings). The state is
``(node, sub, pend)``: ``sub`` is the string prefix matched so far, or the JSON machine's state.
When two strings of a choice share a prefix, the bytes take the role they have in the first listed;
when one string is a prefix of a longer alternative, the longer wins while the text allows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .json_roles import JsonRoleMachine
from .json_schema import Schema
from .roles import Role, combine, combine_all
from .scan import Revision, Scan

_STRING_NODE, _JSON_NODE, _TEXT_NODE, _END_NODE = range(4)

_WSR, _BND, _FREE = int(Role.WHITESPACE), int(Role.BOUNDARY), int(Role.FREE_TEXT)
_FUNC, _TEMPLATE = int(Role.FUNC_NAME), int(Role.TEMPLATE)
_WS = frozenset(b" \t\n\r")
_PUNCT = frozenset(b'{}[](),:;"=')
_MARKUP_RE = re.compile(rb"<[^<>\n]*>")
_NAME_ATTR_RE = re.compile(rb'(?:name="|function=|functions\.)([A-Za-z_][A-Za-z0-9_.\-]*)')
# The schema a tool-call envelope in a begin string is read with: ``name`` is the function name.
_ENVELOPE = Schema({"type": "object", "properties": {"name": {}, "arguments": {}, "parameters": {}}})

#: (string, per-byte roles, target node)
Alt = tuple[bytes, tuple[int, ...], int]
#: per prefix of a node's strings: (role of its last byte, target if a string ends here else -1,
#: whether a longer string continues the prefix)
TrieEntry = tuple[int, int, bool]


def _json_fragment_roles(data: bytes) -> list[int]:
    """Per-byte roles of a JSON envelope fragment, revisions applied."""
    machine = JsonRoleMachine(_ENVELOPE)
    state = machine.initial
    roles: list[int] = []
    for b in data:
        state, role, revision = machine.step(state, bytes((b,)))
        if revision is not None:
            final, bases = revision
            start = len(roles) - len(bases)
            for k, base in enumerate(bases):
                roles[start + k] = combine(base, final)
        roles.append(role)
    return roles


def literal_roles(text: bytes, *, begin: bool = False) -> tuple[int, ...]:
    """Per-byte roles of a fixed string of a structural tag (see the module docstring).

    Parameters
    ----------
    text
        The string's UTF-8 bytes.
    begin
        True for a tag's begin string: from its first ``{`` outside markup, the rest is read as a
        JSON envelope.
    """
    roles = [_WSR if b in _WS else (_BND if b in _PUNCT else _TEMPLATE) for b in text]
    markup = [(m.start(), m.end()) for m in _MARKUP_RE.finditer(text)]
    for s, e in markup:
        roles[s:e] = [_TEMPLATE] * (e - s)
    if begin:
        j = next((k for k, b in enumerate(text) if b == 0x7B and not any(s <= k < e for s, e in markup)), -1)
        if j >= 0:
            roles[j:] = _json_fragment_roles(text[j:])
    for m in _NAME_ATTR_RE.finditer(text):
        roles[m.start(1) : m.end(1)] = [_FUNC] * (m.end(1) - m.start(1))
    return tuple(roles)


def _text(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"structural tag: {what} must be a string, got {type(value).__name__}")
    return value.encode()


def _legacy_format(tag: Mapping[str, Any]) -> dict[str, Any]:
    """The ``triggered_tags`` format xgrammar reads a legacy structural tag as."""
    structures = tag["structures"]
    triggers = tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError("legacy structural tag: 'structures' and 'triggers' must be lists")
    tags = []
    for s in structures:
        if not isinstance(s, Mapping) or not {"begin", "end"} <= s.keys():
            raise ValueError(f"legacy structural tag: a structure needs 'begin' and 'end': {s!r:.200}")
        schema = s.get("schema")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"legacy structural tag: schema is not valid JSON: {e}") from None
        content = {"type": "json_schema", "json_schema": {} if schema is None else schema}
        tags.append({"type": "tag", "begin": s["begin"], "content": content, "end": s["end"]})
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": bool(tag.get("at_least_one"))}


class StructuralTagRoleMachine:
    """Roles of text generated under a structural tag.

    Parameters
    ----------
    tag
        The parsed structural tag, legacy or ``{"type": "structural_tag", "format": ...}``.

    Raises
    ------
    ValueError
        For a malformed tag or a format this machine does not support.
    """

    def __init__(self, tag: Any) -> None:
        if not isinstance(tag, Mapping):
            raise ValueError(f"a structural tag must be a JSON object, got {type(tag).__name__}")
        if tag.get("structures") is not None:
            fmt = _legacy_format(tag)
        elif isinstance(tag.get("format"), Mapping):
            fmt = tag["format"]
        else:
            raise ValueError("a structural tag needs 'structures' and 'triggers' (legacy) or a 'format' object")
        self._kind: list[int] = []
        self._alts: list[tuple[Alt, ...]] = []  # string nodes: choices; text nodes: exits
        self._eps: list[int] = []  # string nodes: where to go when no string starts here (-1: none)
        self._json: list[JsonRoleMachine | None] = []
        self._next: list[int] = []  # json nodes: the node after the value
        end = self._node(_END_NODE)
        entry = self._build(fmt, end)
        self._tries: list[dict[bytes, TrieEntry]] = [self._trie(n) for n in range(len(self._kind))]
        self._firsts: list[frozenset[int]] = [frozenset(p[0] for p in t if len(p) == 1) for t in self._tries]
        self._span_role: list[dict[bytes, int]] = [self._span_roles(n) for n in range(len(self._kind))]
        self.initial: tuple = (entry, self._enter(entry), ())

    @classmethod
    def from_json(cls, key_string: str) -> StructuralTagRoleMachine:
        """From the structural tag string SGLang's grammar backend receives."""
        try:
            tag = json.loads(key_string)
        except json.JSONDecodeError as e:
            raise ValueError(f"structural tag is not valid JSON: {e}") from None
        return cls(tag)

    # ------------------------------------------------------------------------------------ building
    def _node(self, kind: int) -> int:
        self._kind.append(kind)
        self._alts.append(())
        self._eps.append(-1)
        self._json.append(None)
        self._next.append(-1)
        return len(self._kind) - 1

    def _string_node(self, alts: Sequence[Alt], eps: int = -1) -> int:
        n = self._node(_STRING_NODE)
        self._alts[n] = tuple(alts)
        self._eps[n] = eps
        return n

    def _first_strings(self, n: int) -> tuple[Alt, ...]:
        """The strings that can start at node ``n`` (what ends the free text before it)."""
        kind = self._kind[n]
        if kind == _END_NODE:
            return ()
        if kind != _STRING_NODE:
            raise ValueError("structural tag: any_text / triggered_tags must be followed by a string or the end")
        return self._alts[n] + (self._first_strings(self._eps[n]) if self._eps[n] >= 0 else ())

    def _tag(self, fmt: Mapping[str, Any], after: int) -> tuple[bytes, tuple[int, ...], int]:
        """(begin, begin roles, content entry) of a ``tag``; its end string leads to ``after``."""
        if fmt.get("type") != "tag":
            raise ValueError(f"structural tag: expected a 'tag', got {fmt.get('type')!r}")
        begin = _text(fmt.get("begin"), "a tag's begin")
        ends = fmt.get("end")
        ends = ends if isinstance(ends, list) else [ends]
        end_alts = [(e, literal_roles(e), after) for e in (_text(x, "a tag's end") for x in ends)]
        end_node = self._string_node(
            [a for a in end_alts if a[0]], eps=after if any(not a[0] for a in end_alts) else -1
        )
        return begin, literal_roles(begin, begin=True), self._build(fmt.get("content"), end_node)

    def _build(self, fmt: Any, after: int) -> int:
        """Entry node of ``fmt``, followed by node ``after``."""
        if not isinstance(fmt, Mapping):
            raise ValueError(f"structural tag: a format must be an object, got {type(fmt).__name__}")
        kind = fmt.get("type")
        if kind == "const_string":
            value = _text(fmt.get("value"), "const_string value")
            return self._string_node([(value, literal_roles(value), after)]) if value else after
        if kind == "json_schema":
            if fmt.get("style", "json") != "json":
                raise ValueError(f"structural tag: json_schema style {fmt.get('style')!r} is not supported")
            schema = fmt.get("json_schema")
            n = self._node(_JSON_NODE)
            self._json[n] = JsonRoleMachine(Schema({} if schema is None else schema))
            self._next[n] = after
            return n
        if kind == "any_text":
            n = self._node(_TEXT_NODE)
            self._alts[n] = self._first_strings(after)
            return n
        if kind == "sequence":
            elements = fmt.get("elements")
            if not isinstance(elements, list):
                raise ValueError("structural tag: sequence 'elements' must be a list")
            for element in reversed(elements):
                after = self._build(element, after)
            return after
        if kind == "tag":
            begin, roles, content = self._tag(fmt, after)
            return self._string_node([(begin, roles, content)])
        if kind == "triggered_tags":
            return self._triggered(fmt, after)
        if kind == "tags_with_separator":
            return self._separated(fmt, after)
        raise ValueError(f"structural tag format {kind!r} is not supported for role tagging")

    def _triggered(self, fmt: Mapping[str, Any], after: int) -> int:
        triggers = [_text(t, "a trigger") for t in fmt.get("triggers") or []]
        tags = fmt.get("tags")
        if not triggers or not isinstance(tags, list) or not tags:
            raise ValueError("structural tag: triggered_tags needs non-empty 'triggers' and 'tags'")
        text = self._node(_TEXT_NODE)
        back = after if fmt.get("stop_after_first") else text
        by_trigger: dict[bytes, list[Alt]] = {t: [] for t in triggers}
        trigger_roles: dict[bytes, tuple[int, ...]] = {}
        for tag in tags:
            begin, roles, content = self._tag(tag, back)
            trigger = next((t for t in triggers if begin.startswith(t)), None)
            if trigger is None:
                raise ValueError(f"structural tag: begin {begin!r} starts with no trigger")
            by_trigger[trigger].append((begin[len(trigger) :], roles[len(trigger) :], content))
            trigger_roles.setdefault(trigger, roles[: len(trigger)])
        exits: list[Alt] = []
        for trigger, alts in by_trigger.items():
            if not alts:
                continue
            if any(not rest for rest, _, _ in alts):
                if len(alts) > 1:
                    raise ValueError(f"structural tag: trigger {trigger!r} is a whole begin and starts other tags")
                target = alts[0][2]
            else:
                target = self._string_node(alts)
            exits.append((trigger, trigger_roles[trigger], target))
        self._alts[text] = tuple(exits) + self._first_strings(after)
        return text

    def _separated(self, fmt: Mapping[str, Any], after: int) -> int:
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ValueError("structural tag: tags_with_separator needs non-empty 'tags'")
        sep = _text(fmt.get("separator", ""), "separator")
        begins = self._string_node(())
        # after a tag: the separator and another tag, or (without a separator) another tag's begin,
        # or what follows
        between = self._string_node([(sep, literal_roles(sep), begins)] if sep else (), eps=after)
        back = after if fmt.get("stop_after_first") else between
        alts = tuple(self._tag(tag, back) for tag in tags)
        self._alts[begins] = alts
        if not sep:
            self._alts[between] = alts
        return begins if fmt.get("at_least_one") else self._string_node(alts, eps=after)

    def _trie(self, n: int) -> dict[bytes, TrieEntry]:
        alts = self._alts[n]
        if self._kind[n] == _STRING_NODE and self._eps[n] >= 0 and self._kind[self._eps[n]] == _STRING_NODE:
            alts = alts + self._first_strings(self._eps[n])
        trie: dict[bytes, TrieEntry] = {}
        for s, roles, target in alts:
            for k in range(1, len(s) + 1):
                p = s[:k]
                role, done, longer = trie.get(p, (roles[k - 1], -1, False))
                if k == len(s) and done < 0:
                    done = target
                if k < len(s):
                    longer = True
                trie[p] = (role, done, longer)
        return trie

    def _span_roles(self, n: int) -> dict[bytes, int]:
        """Text nodes: the role a matched exit string gives the tokens that spelled it."""
        if self._kind[n] != _TEXT_NODE:
            return {}
        return {s: combine_all(r) for s, r, _ in self._alts[n]}

    def _enter(self, n: int) -> Any:
        """The ``sub`` state at the start of node ``n``."""
        machine = self._json[n]
        return machine.initial[:5] if machine is not None else b""

    # --------------------------------------------------------------------------------------- step
    def step(self, state: tuple, data: bytes) -> tuple[tuple, int, Revision | None]:
        """Walk one token's bytes from ``state``; return the new state, its role and a revision."""
        node, sub, pend = state
        kind = self._kind[node]
        if kind == _TEXT_NODE and not sub and not any(c in data for c in self._firsts[node]):
            return state, (_FREE if any(b not in _WS for b in data) else _WSR), None
        scan = Scan(pend)
        i, n = 0, len(data)
        while i < n:
            kind = self._kind[node]
            if kind == _JSON_NODE:
                machine = self._json[node]
                sub, i = machine.walk(sub, data, i, scan, stop_at_done=True)
                if machine.is_done(sub):
                    node = self._next[node]
                    sub = self._enter(node)
                continue
            b = data[i]
            p = sub + bytes((b,))
            entry = self._tries[node].get(p)
            if kind == _STRING_NODE:
                if entry is not None:
                    i += 1
                    role, done, longer = entry
                    scan.add(role)
                    if done >= 0 and not longer:
                        node, sub = done, self._enter(done)
                    else:
                        sub = p
                    continue
                done = self._tries[node][sub][1] if sub else -1
                if done >= 0:  # a complete string that a longer one could have continued
                    node, sub = done, self._enter(done)
                elif not sub and self._eps[node] >= 0:
                    node = self._eps[node]
                    sub = self._enter(node)
                else:  # outside the grammar: the byte is text, the string starts over
                    i += 1
                    scan.add(_WSR if b in _WS else _FREE)
                    sub = b""
                continue
            if kind == _TEXT_NODE:
                if entry is not None:
                    i += 1
                    role, done, longer = entry
                    scan.span(role)
                    if done >= 0 and not longer:
                        scan.resolve(self._span_role[node][p])
                        node, sub = done, self._enter(done)
                    else:
                        sub = p
                    continue
                if sub:
                    done = self._tries[node][sub][1]
                    if done >= 0:
                        scan.resolve(self._span_role[node][sub])
                        node, sub = done, self._enter(done)
                    else:
                        scan.resolve(_FREE)
                        sub = b""
                    continue
                i += 1
                scan.add(_WSR if b in _WS else _FREE)
                continue
            i += 1  # the end node: nothing may follow
            scan.add(_WSR if b in _WS else _FREE)
        machine = self._json[node]
        span_open = machine.span_open(sub) if machine is not None else (self._kind[node] == _TEXT_NODE and bool(sub))
        role, pend = scan.finish(span_open=span_open)
        return (node, sub, pend), role, scan.revision
