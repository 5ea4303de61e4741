"""Roles from xgrammar capture annotations: ``column[capture="arg_key"] ::= [a-z_]+``.

xgrammar records ``(name, matched bytes)`` whenever an annotated rule completes, and undoes the
record on rollback (``GrammarMatcher.get_captures()``). A capture whose name is a role label raises
the role of every token it overlaps (:func:`.roles.combine`) on top of the lexer roles
(:mod:`.lexer_roles`). Captures never lower a role: grammar syntax is ``BOUNDARY`` already, so
captures name content (``arg_key``, ``func_name``, ``value_string``, ...).

Cost and timing. ``get_captures()`` walks the matcher's whole history (measured: 10-25 us per call
after 20-50 tokens, more than xgrammar's own accept-and-mask), so the track does not call it per
token. ``accept`` costs what a lexer-only track costs; the captures are read when :attr:`roles` is
read (and after a rollback), and their roles are applied then. Read ``roles`` when a decision needs
them, not after every token.

Placement. Captures report bytes, not positions. They are listed in the order their rules completed,
so their end positions never decrease: each one is placed at the first occurrence of its bytes that
ends at or after the previous capture's end.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

from .roles import Role, combine
from .tracker import RoleGrammar, RoleTracker

_NEUTRAL = int(Role.WHITESPACE)  # combine(_NEUTRAL, r) == r


class CaptureRoleTracker(RoleTracker):
    """A :class:`.tracker.RoleTracker` that adds roles from the matcher's captures.

    Call :meth:`accept` after ``matcher.accept_token`` and :meth:`rollback` after
    ``matcher.rollback``. Reading :attr:`roles` reads the matcher's captures.

    Parameters
    ----------
    grammar
        A role grammar compiled from an EBNF grammar with role captures.
    matcher
        The request's ``xgrammar.GrammarMatcher`` (anything with ``get_captures()``).
    """

    __slots__ = ("_matcher", "_text", "_ends", "_cap", "_out", "_synced", "_cursor")

    def __init__(self, grammar: RoleGrammar, matcher: Any) -> None:
        super().__init__(grammar)
        self._matcher = matcher
        self._text = bytearray()  # all accepted bytes
        self._ends: list[int] = []  # end offset of each token in _text
        self._cap: list[int] = []  # best capture role per token (_NEUTRAL: none)
        self._out: list[int] = []  # combine(lexer role, capture role) per token
        self._synced: list[tuple[str, bytes]] | None = []  # captures applied so far (None: redo all)
        self._cursor = 0  # end of the last placed capture

    @property
    def roles(self) -> list[int]:
        """Role of every accepted token, captures included (a live view: do not modify)."""
        self._sync()
        return self._out

    def accept(self, token_id: int) -> int:
        """Append the lexer role of a newly accepted token and return it (captures apply on read)."""
        undo = self._undo
        mark = len(undo)
        role = super().accept(token_id)
        roles, out, cap = self._roles, self._out, self._cap
        for _, i, _ in undo[mark:]:  # the lexer revised earlier tokens
            out[i] = combine(roles[i], cap[i])
        if token_id not in self._grammar.vocab.special_ids:
            self._text += self._grammar.vocab.token_bytes[token_id]
        self._ends.append(len(self._text))
        cap.append(_NEUTRAL)
        out.append(role)
        return role

    def extend(self, token_ids: Iterable[int]) -> None:
        """:meth:`accept` each token in order."""
        for token_id in token_ids:
            self.accept(token_id)

    def _sync(self) -> None:
        captures = self._matcher.get_captures()
        synced = self._synced
        if synced is not None and captures[: len(synced)] == synced:
            new = captures[len(synced) :]
        else:  # a capture was extended or removed: place them all again
            self._redo()
            new = captures
        for name, value in new:
            self._place(self._grammar.captures.get(name), value)
        self._synced = captures

    def _redo(self) -> None:
        roles, cap, out = self._roles, self._cap, self._out
        for i in range(len(roles)):
            if cap[i] != _NEUTRAL or out[i] != roles[i]:
                cap[i] = _NEUTRAL
                if out[i] != roles[i]:
                    out[i] = roles[i]
                    if i < self.revised_from:
                        self.revised_from = i
        self._cursor = 0

    def _place(self, role: int | None, value: bytes) -> None:
        if not value:
            return
        start = self._text.find(value, max(0, self._cursor - len(value)))
        if start < 0:
            return
        end = start + len(value)
        self._cursor = end
        if role is None:
            return
        ends, cap, out, roles = self._ends, self._cap, self._out, self._roles
        i = bisect_right(ends, start)
        while i < len(ends) and (ends[i - 1] if i else 0) < end:
            new = combine(cap[i], role)
            if new != cap[i]:
                cap[i] = new
                merged = combine(roles[i], new)
                if merged != out[i]:
                    out[i] = merged
                    if i < self.revised_from:
                        self.revised_from = i
            i += 1

    def rollback(self, k: int) -> None:
        """Forget the last ``k`` tokens (after the matcher rolled back the same ``k``)."""
        super().rollback(k)
        n = len(self._roles)
        del self._out[n:], self._cap[n:], self._ends[n:]
        del self._text[self._ends[-1] if self._ends else 0 :]
        self._synced = None  # captures of the forgotten tokens are gone: place them again on read

    def copy(self, matcher: Any = None) -> CaptureRoleTracker:
        """An independent track in the same state; ``matcher`` is the forked matcher it follows.

        Raises
        ------
        ValueError
            If no matcher is given.
        """
        if matcher is None:
            raise ValueError("a capture-based track follows a matcher: pass the forked GrammarMatcher")
        other = CaptureRoleTracker(self._grammar, matcher)
        self._copy_into(other)
        other._text = self._text.copy()
        other._ends = self._ends.copy()
        other._cap = self._cap.copy()
        other._out = self._out.copy()
        other._synced = self._synced
        other._cursor = self._cursor
        return other
