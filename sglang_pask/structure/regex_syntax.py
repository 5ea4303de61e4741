"""A regex's syntax tree as role analysis needs it: literal characters, groups, repeats.

:func:`parse` reads the regex syntax that xgrammar's regex dialect and Python's share, in one
left-to-right pass, and keeps the tree exactly as written. Python's own parser (``re._parser``)
optimises its tree for matching: it moves a prefix common to all alternatives out of the group
(``(get_a|get_b)`` becomes ``get_(a|b)``) and turns alternatives of one character into a character
class. Both change which literal runs a regex seems to have, so role analysis reads this tree
instead (it is also about three times faster, which matters: every BFCL item brings a new regex).

The tree
--------
A sequence (``Seq``) is a list of nodes; a node is one of:

- a ``str``: a run of literal characters, as long as it goes (two are never adjacent; an escaped
  character, or a class of one character such as ``[(]``, is a literal character);
- ``(GROUP, alternatives)``: a group, or the whole regex, with its alternatives (``list[Seq]``,
  one for a group without ``|``; an empty alternative is an empty list);
- ``(REPEAT, min, Seq)``: a quantified node (``?``, ``*``, ``+``, ``{m,n}``, lazy or possessive),
  ``min`` its least count, the ``Seq`` holding the one node repeated;
- ``None``: anything that matches no fixed character: a character class, ``.``, ``\\d``, an anchor,
  a lookaround, a back-reference.

Errors
------
:class:`RegexSyntaxError` (a ``ValueError``) for what neither dialect accepts: an unbalanced
parenthesis, a quantifier with nothing to repeat (an anchor included), an unterminated class, an
unknown escape or group kind; and for the verbose flag ``(?x)``, whose whitespace rules this reader
does not follow. A back-reference is not checked against the groups (xgrammar has none anyway).
"""

from __future__ import annotations

import re
from typing import Union

GROUP = "|"
REPEAT = "*"

Node = Union[str, tuple, None]
Seq = list[Node]

_QUANT_RE = re.compile(r"\{(\d*)(,?)(\d*)\}")
_CLASS_END_RE = re.compile(r"\[\^?(?:[^\\]|\\.)(?:[^\]\\]|\\.)*\]", re.S)  # a first ] is a member
_FLAGS_RE = re.compile(r"\(\?([aiLmsux-]+)(\)|:)")
_NAMED_RE = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")
_OCTAL_RE = re.compile(r"[0-7]{0,2}")
_HEX = {"x": 2, "u": 4, "U": 8}
_CONTROL = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_NON_LITERAL_ESCAPES = frozenset("dDwWsSbBAZ0123456789")
_ANCHOR_ESCAPES = frozenset("bBAZ")
_SPECIAL = frozenset("()|*+?{[\\.^$")
_PLAIN_RE = re.compile(r"[^()|*+?{\[\\.^$]+")


class RegexSyntaxError(ValueError):
    """The regex does not parse; ``pos`` is the offset of the problem."""

    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(f"regex does not parse at position {pos}: {msg}")
        self.pos = pos


def _add_literal(seq: Seq, text: str) -> None:
    if seq and isinstance(seq[-1], str):
        seq[-1] += text
    else:
        seq.append(text)


class _Reader:
    def __init__(self, regex: str) -> None:
        self.text = regex
        self.pos = 0
        self.anchor_end = -1  # where the last anchor (^ $ \b \B \A \Z) ends: it cannot be repeated

    def alternatives(self, depth: int) -> list[Seq]:
        """Alternatives up to the ``)`` closing this depth (not consumed) or the end."""
        text = self.text
        alts: list[Seq] = []
        seq: Seq = []
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == ")":
                if depth == 0:
                    raise RegexSyntaxError("unbalanced parenthesis", self.pos)
                break
            if ch == "|":
                alts.append(seq)
                seq = []
                self.pos += 1
            elif ch in "*+?{":
                self.quantifier(seq)
            elif ch not in _SPECIAL:
                m = _PLAIN_RE.match(text, self.pos)
                _add_literal(seq, m.group())
                self.pos = m.end()
            else:
                node = self.atom(ch, depth)
                if isinstance(node, str):
                    _add_literal(seq, node)
                else:
                    seq.append(node)
        alts.append(seq)
        return alts

    def quantifier(self, seq: Seq) -> None:
        text, start = self.text, self.pos
        ch = text[start]
        if ch == "{":
            m = _QUANT_RE.match(text, start)
            if m is None or m.group() == "{}":
                _add_literal(seq, "{")  # not a quantifier: a literal brace, as in Python
                self.pos += 1
                return
            least = int(m.group(1) or 0)
            self.pos = m.end()
        else:
            least = 1 if ch == "+" else 0
            self.pos += 1
        if not seq or self.anchor_end == start:
            raise RegexSyntaxError("nothing to repeat", start)
        if isinstance(seq[-1], tuple) and seq[-1][0] == REPEAT:
            raise RegexSyntaxError("multiple repeat", start)
        if self.pos < len(text) and text[self.pos] in "?+":  # lazy or possessive
            self.pos += 1
        last = seq[-1]
        if isinstance(last, str) and len(last) > 1:  # the quantifier takes the run's last character
            seq[-1] = last[:-1]
            seq.append((REPEAT, least, [last[-1]]))
        else:
            seq[-1] = (REPEAT, least, [last])

    def atom(self, ch: str, depth: int) -> Node:
        text, start = self.text, self.pos
        if ch == "(":
            return self.group(depth)
        if ch == "[":
            m = _CLASS_END_RE.match(text, start)
            if m is None:
                raise RegexSyntaxError("unterminated character set", start)
            self.pos = m.end()
            body = m.group()[1:-1]
            if len(body) == 1 and body != "^":
                return body
            if len(body) == 2 and body[0] == "\\" and not body[1].isalnum():
                return body[1]
            return None
        if ch == "\\":
            return self.escape()
        self.pos += 1
        if ch != ".":
            self.anchor_end = self.pos
        return None  # . ^ $

    def escape(self) -> Node:
        text, start = self.text, self.pos
        if start + 1 >= len(text):
            raise RegexSyntaxError("bad escape (end of pattern)", start)
        ch = text[start + 1]
        self.pos = start + 2
        if ch in _NON_LITERAL_ESCAPES:
            if ch == "0":  # octal: \0, \0o, \0oo
                m = _OCTAL_RE.match(text, self.pos)
                self.pos = m.end()
                return chr(int("0" + m.group(), 8))
            if ch.isdigit():  # back-reference
                while self.pos < len(text) and text[self.pos].isdigit():
                    self.pos += 1
            elif ch in _ANCHOR_ESCAPES:
                self.anchor_end = self.pos
            return None
        if ch in _CONTROL:
            return _CONTROL[ch]
        if ch in _HEX:
            digits = text[self.pos : self.pos + _HEX[ch]]
            if len(digits) != _HEX[ch] or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise RegexSyntaxError(f"incomplete escape \\{ch}{digits}", start)
            self.pos += _HEX[ch]
            return chr(int(digits, 16))
        if ch.isascii() and ch.isalpha():
            raise RegexSyntaxError(f"bad escape \\{ch}", start)
        return ch

    def group(self, depth: int) -> Node:
        text, start = self.text, self.pos
        zero_width = False
        if text.startswith("(?", start):
            if text.startswith("(?#", start):  # a comment
                end = text.find(")", start)
                if end < 0:
                    raise RegexSyntaxError("missing ), unterminated comment", start)
                self.pos = end + 1
                return None
            flags = _FLAGS_RE.match(text, start)
            named = _NAMED_RE.match(text, start)
            if flags is not None:
                if "x" in flags.group(1):
                    raise RegexSyntaxError("the verbose flag (?x) is not supported", start)
                self.pos = flags.end()
                if flags.group(2) == ")":
                    return None  # global flags: match nothing themselves
            elif named is not None:
                self.pos = named.end()
            elif text.startswith(("(?:", "(?>"), start):
                self.pos = start + 3
            elif text.startswith(("(?=", "(?!"), start):
                self.pos, zero_width = start + 3, True
            elif text.startswith(("(?<=", "(?<!"), start):
                self.pos, zero_width = start + 4, True
            elif text.startswith("(?P=", start):  # named back-reference
                end = text.find(")", start)
                if end < 0:
                    raise RegexSyntaxError("missing ), unterminated name", start)
                self.pos = end + 1
                return None
            else:
                raise RegexSyntaxError("unknown extension", start + 1)
        else:
            self.pos = start + 1
        alts = self.alternatives(depth + 1)
        if self.pos >= len(text):
            raise RegexSyntaxError("missing ), unterminated subpattern", start)
        self.pos += 1
        return None if zero_width else (GROUP, alts)


def parse(regex: str) -> Seq:
    """The syntax tree of ``regex`` (module docstring); one ``GROUP`` node if it has a top-level ``|``.

    Raises
    ------
    RegexSyntaxError
        If the regex does not parse.
    """
    alts = _Reader(regex).alternatives(0)
    return alts[0] if len(alts) == 1 else [(GROUP, alts)]


def literal_strings(seq: Seq, limit: int = 64) -> list[str] | None:
    """Every string ``seq`` matches, if it is a finite choice of literals (at most ``limit``)."""
    out = [""]
    for node in seq:
        if isinstance(node, str):
            out = [s + node for s in out]
            continue
        if node is None or node[0] != GROUP:
            return None
        tails: list[str] = []
        for alt in node[1]:
            got = literal_strings(alt, limit)
            if got is None:
                return None
            tails.extend(got)
        out = [s + t for s in out for t in tails]
        if len(out) > limit:
            return None
    return out
