"""Role machine for text under a grammar whose structure the tagger does not model (EBNF, other regexes).

A small lexer: whitespace is ``WHITESPACE``; punctuation is ``BOUNDARY``; a word that the grammar
spells out literally (a keyword such as ``SELECT``, taken from the grammar's string literals) is
``BOUNDARY``; ``true``/``false`` (any case) are ``VALUE_BOOL``, ``null``/``None`` ``VALUE_NULL``;
numbers are ``VALUE_NUMBER``; quoted strings are ``VALUE_STRING`` (quotes ``BOUNDARY``); any other word
is ``FREE_TEXT``. A word's role is certain only at its end (``SEL`` may become ``SELECT`` or
``SELLER``); until then its tokens carry the role that fits the prefix and are revised when the word
ends (see :mod:`.scan`). Content roles of an EBNF grammar come from capture annotations on top of
this (:mod:`.captures`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .roles import Role
from .scan import Revision, Scan

_TEXT, _WORD, _NUM, _STR, _STR_ESC = range(5)

_WS = frozenset(b" \t\n\r\f\v")
_WORD_START = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") | frozenset(range(0x80, 0x100))
_WORD_BYTES = _WORD_START | frozenset(b"0123456789")
_DIGITS = frozenset(b"0123456789")
_QUOTES = frozenset(b"'\"`")
_WSR, _BND, _FREE = int(Role.WHITESPACE), int(Role.BOUNDARY), int(Role.FREE_TEXT)
_STRING, _NUMBER = int(Role.VALUE_STRING), int(Role.VALUE_NUMBER)

_VALUE_WORDS = {
    **{w: int(Role.VALUE_BOOL) for w in ("true", "false", "True", "False", "TRUE", "FALSE")},
    **{w: int(Role.VALUE_NULL) for w in ("null", "None", "NULL", "Null")},
}

# The state is (mode, buf, pend): buf is the current word (bytes) while it can still be a special
# word, or the quote byte (int) of the current string; pend as in scan.py.
State = tuple


class LexerRoleMachine:
    """Roles from a word / number / string / punctuation lexer.

    Parameters
    ----------
    keywords
        Words the grammar spells out literally; they are ``BOUNDARY``.
    """

    def __init__(self, keywords: Iterable[str] = ()) -> None:
        special: dict[bytes, int] = {w.encode(): _BND for w in keywords}
        special.update({w.encode(): r for w, r in _VALUE_WORDS.items()})
        self._special = special
        # tentative role of every proper prefix: the role of the special words it can still become
        prefix_role: dict[bytes, int] = {}
        for word, role in sorted(special.items()):
            for k in range(1, len(word)):
                prefix_role.setdefault(word[:k], role)
        self._prefix_role = prefix_role
        self.initial: State = (_TEXT, None, ())

    def _word_byte(self, scan: Scan, buf: bytes | None, b: int) -> bytes | None:
        """One more byte of a word; returns the new ``buf``."""
        if buf is None:
            scan.add(_FREE)
            return None
        buf = buf + bytes((b,))
        if buf in self._special:
            scan.span(self._special[buf])
        elif buf in self._prefix_role:
            scan.span(self._prefix_role[buf])
        else:
            scan.resolve(_FREE)
            scan.add(_FREE)
            return None
        return buf

    def step(self, state: State, data: bytes) -> tuple[State, int, Revision | None]:
        """Walk one token's bytes from ``state``; return the new state, its role and a revision."""
        mode, buf, pend = state
        if mode == _STR and buf not in data and 0x5C not in data:  # inside a string, and stays
            return state, _STRING, None
        scan = Scan(pend)
        for b in data:
            if mode == _STR:
                if b == buf:
                    scan.add(_BND)
                    mode, buf = _TEXT, None
                else:
                    scan.add(_STRING)
                    if b == 0x5C:
                        mode = _STR_ESC
                continue
            if mode == _STR_ESC:
                scan.add(_STRING)
                mode = _STR
                continue
            if mode == _WORD:
                if b in _WORD_BYTES:
                    buf = self._word_byte(scan, buf, b)
                    continue
                if buf is not None:
                    scan.resolve(self._special.get(buf, _FREE))
                mode, buf = _TEXT, None
            elif mode == _NUM:
                if b in _WORD_BYTES or b == 0x2E:
                    scan.add(_NUMBER)
                    continue
                mode = _TEXT
            if b in _WS:
                scan.add(_WSR)
            elif b in _WORD_START:
                mode = _WORD
                buf = self._word_byte(scan, b"", b)
            elif b in _DIGITS:
                scan.add(_NUMBER)
                mode = _NUM
            elif b in _QUOTES:
                scan.add(_BND)
                mode, buf = _STR, b
            else:
                scan.add(_BND)
        role, pend = scan.finish(span_open=mode == _WORD and buf is not None)
        return (mode, buf, pend), role, scan.revision
