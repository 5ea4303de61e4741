"""Per-token bookkeeping shared by the role machines: the role of a token, and pending spans.

A role machine walks one token's bytes and reports a role per byte. :class:`Scan` folds those into
the token's role with the priority rule of :mod:`.roles`.

Some roles are only certain at the end of a span that may cover several tokens: whether a JSON key
is required is known at its closing quote, whether a word is a grammar keyword at its last letter.
Bytes of such an open span are reported with a *tentative* role (:meth:`Scan.span`). The machine's
state carries ``pend``: the role each earlier token of the open span has without the span (its
*base*). When the span's role becomes certain (:meth:`Scan.resolve`), the step returns a revision
``(final_role, pend)``: the tracker sets each of those earlier tokens to
``combine(base, final_role)``. ``pend`` is bounded by the span's length in tokens.
"""

from __future__ import annotations

from .roles import RANK, ROLE_OF_RANK, Role

#: ``(final_role, bases)``: re-tag the ``len(bases)`` tokens before the current one.
Revision = tuple[int, tuple[int, ...]]

_NEUTRAL = int(Role.WHITESPACE)  # combine(_NEUTRAL, r) == r for every role r


class Scan:
    """Accumulates one token's role while a machine walks its bytes.

    Parameters
    ----------
    pend
        Bases of the earlier tokens of the span that is open when the token starts (empty if none).
    """

    __slots__ = ("pend", "best", "span_best", "revision")

    def __init__(self, pend: tuple[int, ...]) -> None:
        self.pend = pend
        self.best = -1  # rank of the best settled role so far
        self.span_best = -1  # rank of the best tentative role of the open span in this token
        self.revision: Revision | None = None

    def add(self, role: int) -> None:
        """One byte whose role is certain."""
        r = RANK[role]
        if r > self.best:
            self.best = r

    def span(self, role: int) -> None:
        """One byte of the open span, with its tentative role."""
        r = RANK[role]
        if r > self.span_best:
            self.span_best = r

    def resolve(self, role: int) -> None:
        """The open span's role is now certain: ``role``."""
        if self.span_best >= 0:
            self.add(role)
            self.span_best = -1
        if self.pend:
            assert self.revision is None, "only the span open at the token's start has earlier tokens"
            self.revision = (role, self.pend)
            self.pend = ()

    def finish(self, span_open: bool) -> tuple[int, tuple[int, ...]]:
        """The token's role and the ``pend`` to carry into the next token's state."""
        if span_open and self.span_best >= 0:
            base = ROLE_OF_RANK[self.best] if self.best >= 0 else _NEUTRAL
            pend = self.pend + (base,)
        else:
            pend = self.pend if span_open else ()
        best = max(self.best, self.span_best)
        return (ROLE_OF_RANK[best] if best >= 0 else int(Role.TEMPLATE)), pend
