"""Find JSON values inside text and parse them with the character span of every key and value."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_WS_RE = re.compile(r"[ \t\n\r]*")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_DECODER = json.JSONDecoder()


@dataclass
class JsonNode:
    """One JSON value and where it is: ``text[start:end]`` (strings include their quotes).

    ``value`` is the Python value for strings and scalars; ``members`` holds ``(key, value)`` node
    pairs of an object; ``items`` the element nodes of an array.
    """

    kind: str  # "object", "array", "string", "scalar"
    start: int
    end: int
    value: Any = None
    members: list[tuple[JsonNode, JsonNode]] = field(default_factory=list)
    items: list[JsonNode] = field(default_factory=list)

    def get(self, key: str) -> JsonNode | None:
        """The value node of ``key`` in an object node (the last one if repeated)."""
        found = None
        for k, v in self.members:
            if k.value == key:
                found = v
        return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text

    def ws(self, i: int) -> int:
        m = _WS_RE.match(self.text, i)
        assert m is not None
        return m.end()

    def value(self, i: int) -> JsonNode:
        text = self.text
        c = text[i] if i < len(text) else ""
        if c == "{":
            node = JsonNode("object", i, i)
            i = self.ws(i + 1)
            if text[i] != "}":
                while True:
                    key = self.string(i)
                    i = self.ws(key.end)
                    if text[i] != ":":
                        raise ValueError(f"expected ':' at {i}")
                    val = self.value(self.ws(i + 1))
                    node.members.append((key, val))
                    i = self.ws(val.end)
                    if text[i] == ",":
                        i = self.ws(i + 1)
                        continue
                    if text[i] == "}":
                        break
                    raise ValueError(f"expected ',' or '}}' at {i}")
            node.end = i + 1
            return node
        if c == "[":
            node = JsonNode("array", i, i)
            i = self.ws(i + 1)
            if text[i] != "]":
                while True:
                    item = self.value(i)
                    node.items.append(item)
                    i = self.ws(item.end)
                    if text[i] == ",":
                        i = self.ws(i + 1)
                        continue
                    if text[i] == "]":
                        break
                    raise ValueError(f"expected ',' or ']' at {i}")
            node.end = i + 1
            return node
        if c == '"':
            return self.string(i)
        m = _SCALAR_RE.match(text, i)
        if m is None:
            raise ValueError(f"no JSON value at {i}")
        return JsonNode("scalar", i, m.end(), json.loads(m.group()))

    def string(self, i: int) -> JsonNode:
        m = _STRING_RE.match(self.text, i)
        if m is None:
            raise ValueError(f"expected a string at {i}")
        return JsonNode("string", i, m.end(), json.loads(m.group()))


def parse_at(text: str, start: int) -> JsonNode | None:
    """The JSON value that starts at ``text[start]`` with its spans, or None if there is none."""
    try:
        _, end = _DECODER.raw_decode(text, start)
        return _Parser(text[:end]).value(start)
    except ValueError:  # not JSON, or JSON outside the standard (NaN, Infinity)
        return None


def iter_json(text: str, starts: str = "{[") -> Iterator[JsonNode]:
    """JSON objects / arrays in ``text``, left to right, not overlapping.

    A start character that does not begin a valid value is skipped, so values nested in invalid
    JSON are still found.
    """
    i = 0
    pattern = re.compile("[" + re.escape(starts) + "]")
    while True:
        m = pattern.search(text, i)
        if m is None:
            return
        node = parse_at(text, m.start())
        if node is None:
            i = m.start() + 1
            continue
        yield node
        i = node.end
